# uka at paper scale (source.kind esconv): ESConv's PPDPP split files by their pinned sha256 (config, else
# config/locks/uka.json, written by `paperflow pin uka`), the backbone LLM at its pinned Hub commit, and every LLM
# stage (ToM table, acquisition, test dialogues, judge) on its own GPU job that starts a vLLM server for itself.
from paperflow.core.download import read_lock, read_lock_revisions

UKA_CACHE = f"{RUN.resources}/uka"
UKA_LOCK = read_lock_revisions("uka", PAPERFLOW_ROOT)  # a pin changes the params: the download reruns
UKA_LOCKED_FILES = read_lock("uka", PAPERFLOW_ROOT)
UKA_REFERENCE = UKA["win_rate"]["reference"]
UKA_LLM = {
    k: UKA[k]
    for k in ("simulation", "training", "agent", "critic", "llm", "server", "pretrained", "judge", "resources")
}
UKA_WILDCARDS = {"method": "|".join(UKA["methods"])}


paper_stages(
    "uka",
    UKA,
    uka_path,
    stage(
        "download",
        script="download_esconv.py",
        env="lm",  # its modules reach the Hub helpers and the LM kit
        resources=resources_of("cpu_light"),
        output={
            "train": uka_path("raw", "esconv", "train.jsonl"),
            "test": uka_path("raw", "esconv", "test.jsonl"),
        },
        reads=["data"],
        params={"locked": {s: UKA_LOCKED_FILES.get(f["url"]) for s, f in UKA["data"].items()}},
    ),
    hub_model_stage(
        "uka",
        "download_model",
        UKA["pretrained"],
        "pretrained.revision",
        UKA_CACHE,
        uka_path("models", "pretrained.json"),
        resources=resources_of("cpu_medium", runtime=240),
        params={"locked": UKA_LOCK.get(f"model:{UKA['pretrained']['hub']}")},
    ),
    hub_model_stage(
        "uka",
        "download_judge",
        UKA["judge"],
        "judge.revision",
        UKA_CACHE,
        uka_path("models", "judge.json"),
        resources=resources_of("cpu_medium", runtime=240),
        params={"locked": UKA_LOCK.get(f"model:{UKA['judge']['hub']}")},
    ),
    stage(
        "preprocess",
        script="preprocess_esconv.py",
        env="lm",  # MiniLM through the kit's shared sentence-encoder loader
        resources=resources_of("cpu_light"),
        input={
            "train": uka_path("raw", "esconv", "train.jsonl"),
            "test": uka_path("raw", "esconv", "test.jsonl"),
        },
        output={
            "cases": uka_path("data", "cases.parquet"),
            "embeddings": uka_path("data", "embeddings.parquet"),
        },
        benchmark=True,
        threads=2,
        reads=["embedding"],
    ),
    stage(
        "tom",
        script="tom.py",
        env="lm-serve",
        resources=heavy_resources("infer_gpu", UKA, stage="tom"),
        input={"pretrained": uka_path("models", "pretrained.json")},
        output=uka_path("models", "tom.json"),
        benchmark=True,
        threads=4,
        reads=["tom", "seeds"],
        params={"settings": UKA_LLM},
    ),
    stage(
        "train",
        script="train_llm.py",
        env="lm-serve",
        resources=heavy_resources("train_gpu", UKA, stage="train"),
        input={
            "pretrained": uka_path("models", "pretrained.json"),
            "cases": uka_path("data", "cases.parquet"),
            "embeddings": uka_path("data", "embeddings.parquet"),
            "tom": uka_path("models", "tom.json"),
        },
        output={
            "memory": uka_path("models", "{method}", "memory.parquet"),
            "attempts": uka_path("models", "{method}", "attempts.csv"),
        },
        wildcards={"method": UKA_WILDCARDS["method"]},
        tag="{method}",
        benchmark=True,
        threads=4,
        reads=["seeds"],
        params={"settings": UKA_LLM},
    ),
    stage(
        "evaluate",
        script="evaluate_llm.py",
        env="lm-serve",
        resources=heavy_resources("infer_gpu", UKA, stage="evaluate"),
        unpack=uka_paper_memory,
        input={
            "pretrained": uka_path("models", "pretrained.json"),
            "cases": uka_path("data", "cases.parquet"),
            "embeddings": uka_path("data", "embeddings.parquet"),
            "tom": uka_path("models", "tom.json"),
        },
        output={
            "per_case": uka_path("eval", "{method}", "per_case.parquet"),
            "per_turn": uka_path("eval", "{method}", "per_turn.parquet"),
            "transcripts": uka_path("eval", "{method}", "transcripts.jsonl"),
        },
        wildcards={"method": UKA_WILDCARDS["method"]},
        tag="{method}",
        benchmark=True,
        threads=4,
        reads=["seeds"],
        params={"settings": UKA_LLM},
    ),
    stage(
        "win_rate",
        script="win_rate.py",
        env="lm-serve",
        resources=heavy_resources("infer_gpu", UKA, stage="win_rate"),
        input={
            "judge": uka_path("models", "judge.json"),
            "cases": uka_path("data", "cases.parquet"),
            "mine": uka_path("eval", "{method}", "transcripts.jsonl"),
            "theirs": uka_path("eval", UKA_REFERENCE, "transcripts.jsonl"),
        },
        output=uka_path("eval", "{method}", "win_rate.parquet"),
        wildcards={"method": "|".join(uka_judged())},
        tag="{method}",
        benchmark=True,
        threads=4,
        reads=["seeds"],
        params={"settings": UKA_LLM, "reference": UKA_REFERENCE},
    ),
    stage(
        "report",
        script="report_paper.py",
        env="base",
        resources=resources_of("cpu_light"),
        input={
            **keyed("per_case", {(m,): uka_path("eval", m, "per_case.parquet") for m in UKA["methods"]}),
            **keyed("wins", {(m,): uka_path("eval", m, "win_rate.parquet") for m in uka_judged()}),
            **keyed("attempts", {(m,): uka_path("models", m, "attempts.csv") for m in uka_paper_trained()}),
        },
        output={
            "report": uka_path("report.md"),
            "metrics": uka_path("metrics.json"),
            "metrics_table": uka_path("metrics.parquet"),
            "table_methods": report(uka_path("tables", "methods.csv"), category="uka", labels={"table": "methods"}),
            "figure_success": report(
                uka_path("figures", "success.png"), category="uka", labels={"figure": "success rate"}
            ),
        },
        reads=["seeds", "pretrained", "simulation", "critic", "win_rate", "claims", "claims_not_measured"],
        params={"scale": RUN.scale},
    ),
)
