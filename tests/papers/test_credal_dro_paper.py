"""credal_dro at paper scale, offline: the text embedding in shards (paperflow.credal_dro.embed_shards) that a killed
credal_dro_embed job resumes from, on a counting stand-in for the encoder. No model is loaded."""

from __future__ import annotations

import numpy as np
import pytest

from paperflow.credal_dro.embed_shards import INDEX, encode_in_shards


class Encoder:
    """A deterministic stand-in for MiniLM (a text's vector from its characters), killed after `limit` calls;
    records the texts of every call."""

    def __init__(self, limit: int | None = None):
        self.limit, self.calls = limit, []

    def __call__(self, texts, batch_size, device, progress):
        if self.limit is not None and len(self.calls) >= self.limit:
            raise RuntimeError("killed")
        self.calls.append(list(texts))
        return np.array([[len(t), sum(map(ord, t)) % 97, t.count("a")] for t in texts], dtype=np.float32)


DISTINCT = [f"comment {i} about a thing" for i in range(48)]
TEXTS = DISTINCT[::-1] + DISTINCT[:12]  # out of order, with repeats


def test_a_killed_embedding_resumes_from_its_shards_and_encodes_only_the_rest(tmp_path):
    whole = Encoder()
    expected = encode_in_shards(TEXTS, 8, folder=None, shard_texts=5, encode=whole)  # outside a job: scratch
    distinct = sorted(set(TEXTS))
    assert [t for call in whole.calls for t in call] == distinct and len(whole.calls) == 10  # 48 distinct, 5 a shard
    np.testing.assert_array_equal(expected, Encoder()(TEXTS, 8, "cpu", False))  # each text's own vector, in order

    folder = tmp_path / "checkpoints"
    with pytest.raises(RuntimeError, match="killed"):
        encode_in_shards(TEXTS, 8, folder=folder, shard_texts=5, encode=Encoder(limit=4))
    assert len((folder / INDEX).read_text().splitlines()) == 4 and len(list(folder.glob("shard_*.npy"))) == 4
    rerun = Encoder()
    got = encode_in_shards(TEXTS, 8, folder=folder, shard_texts=5, encode=rerun)
    assert rerun.calls == whole.calls[4:]  # only the shards the killed run had not finished
    np.testing.assert_array_equal(got, expected)
    assert got.dtype == np.float32


def test_shards_of_other_texts_are_refused(tmp_path):
    encode_in_shards(TEXTS, 8, folder=tmp_path, shard_texts=5, encode=Encoder())
    with pytest.raises(ValueError, match="other texts"):
        encode_in_shards([*TEXTS, "a new comment"], 8, folder=tmp_path, shard_texts=5, encode=Encoder())
