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


def uka_paper_trained():
    return sorted({uka_trainer(m) for m in UKA["methods"]} - {None})


def uka_paper_memory(wildcards):
    trainer = uka_trainer(wildcards.method)
    return {"memory": uka_path("models", trainer, "memory.parquet")} if trainer else {}


def uka_judged():
    return [m for m in UKA["methods"] if m != UKA_REFERENCE]


rule uka_download:
    output:
        train=uka_path("raw", "esconv", "train.jsonl"),
        test=uka_path("raw", "esconv", "test.jsonl"),
    log:
        uka_path("logs", "download.log"),
    conda:
        env_file("lm")  # its modules reach the Hub helpers and the LM kit
    threads: 1
    resources:
        **resources_of("cpu_light"),
    params:
        data=UKA["data"],
        locked={s: UKA_LOCKED_FILES.get(f["url"]) for s, f in UKA["data"].items()},
        code=code_param("lm", "workflows/uka/scripts/download_esconv.py"),
    script:
        "scripts/download_esconv.py"


rule uka_download_model:
    output:
        uka_path("models", "pretrained.json"),
    log:
        uka_path("logs", "download_model.log"),
    conda:
        env_file("lm")
    threads: 1
    resources:
        **resources_of("cpu_medium", runtime=240),
    params:
        pretrained=UKA["pretrained"],
        key="pretrained",
        locked=UKA_LOCK.get(f"model:{UKA['pretrained']['hub']}"),
        cache=UKA_CACHE,
        code=code_param("lm", "workflows/uka/scripts/download_model.py"),
    script:
        "scripts/download_model.py"


rule uka_download_judge:
    output:
        uka_path("models", "judge.json"),
    log:
        uka_path("logs", "download_judge.log"),
    conda:
        env_file("lm")
    threads: 1
    resources:
        **resources_of("cpu_medium", runtime=240),
    params:
        pretrained=UKA["judge"],
        key="judge",
        locked=UKA_LOCK.get(f"model:{UKA['judge']['hub']}"),
        cache=UKA_CACHE,
        code=code_param("lm", "workflows/uka/scripts/download_model.py"),
    script:
        "scripts/download_model.py"


rule uka_preprocess:
    input:
        train=uka_path("raw", "esconv", "train.jsonl"),
        test=uka_path("raw", "esconv", "test.jsonl"),
    output:
        cases=uka_path("data", "cases.parquet"),
        embeddings=uka_path("data", "embeddings.parquet"),
    log:
        uka_path("logs", "preprocess.log"),
    benchmark:
        uka_path("benchmarks", "preprocess.tsv")
    conda:
        env_file("lm")  # MiniLM through the kit's shared sentence-encoder loader
    threads: 2
    resources:
        **resources_of("cpu_light"),
    params:
        embedding=UKA["embedding"],
        code=code_param("lm", "workflows/uka/scripts/preprocess_esconv.py"),
    script:
        "scripts/preprocess_esconv.py"


rule uka_tom:
    input:
        pretrained=uka_path("models", "pretrained.json"),
    output:
        uka_path("models", "tom.json"),
    log:
        uka_path("logs", "tom.log"),
    benchmark:
        uka_path("benchmarks", "tom.tsv")
    conda:
        env_file("lm-serve")
    threads: 4
    resources:
        **heavy_resources("infer_gpu", UKA, stage="tom"),
    params:
        settings=UKA_LLM,
        tom=UKA["tom"],
        seeds=UKA["seeds"],
        code=code_param("lm-serve", "workflows/uka/scripts/tom.py"),
    script:
        "scripts/tom.py"


rule uka_train:
    input:
        pretrained=uka_path("models", "pretrained.json"),
        cases=uka_path("data", "cases.parquet"),
        embeddings=uka_path("data", "embeddings.parquet"),
        tom=uka_path("models", "tom.json"),
    output:
        memory=uka_path("models", "{method}", "memory.parquet"),
        attempts=uka_path("models", "{method}", "attempts.csv"),
    log:
        uka_path("logs", "train", "{method}.log"),
    benchmark:
        uka_path("benchmarks", "train_{method}.tsv")
    wildcard_constraints:
        method=UKA_WILDCARDS["method"],
    conda:
        env_file("lm-serve")
    threads: 4
    resources:
        **heavy_resources("train_gpu", UKA, stage="train"),
    params:
        settings=UKA_LLM,
        seeds=UKA["seeds"],
        code=code_param("lm-serve", "workflows/uka/scripts/train_llm.py"),
    script:
        "scripts/train_llm.py"


rule uka_evaluate:
    input:
        unpack(uka_paper_memory),
        pretrained=uka_path("models", "pretrained.json"),
        cases=uka_path("data", "cases.parquet"),
        embeddings=uka_path("data", "embeddings.parquet"),
        tom=uka_path("models", "tom.json"),
    output:
        per_case=uka_path("eval", "{method}", "per_case.parquet"),
        per_turn=uka_path("eval", "{method}", "per_turn.parquet"),
        transcripts=uka_path("eval", "{method}", "transcripts.jsonl"),
    log:
        uka_path("logs", "evaluate", "{method}.log"),
    benchmark:
        uka_path("benchmarks", "evaluate_{method}.tsv")
    wildcard_constraints:
        method=UKA_WILDCARDS["method"],
    conda:
        env_file("lm-serve")
    threads: 4
    resources:
        **heavy_resources("infer_gpu", UKA, stage="evaluate"),
    params:
        settings=UKA_LLM,
        seeds=UKA["seeds"],
        code=code_param("lm-serve", "workflows/uka/scripts/evaluate_llm.py"),
    script:
        "scripts/evaluate_llm.py"


rule uka_win_rate:
    input:
        judge=uka_path("models", "judge.json"),
        cases=uka_path("data", "cases.parquet"),
        mine=uka_path("eval", "{method}", "transcripts.jsonl"),
        theirs=uka_path("eval", UKA_REFERENCE, "transcripts.jsonl"),
    output:
        uka_path("eval", "{method}", "win_rate.parquet"),
    log:
        uka_path("logs", "win_rate", "{method}.log"),
    benchmark:
        uka_path("benchmarks", "win_rate_{method}.tsv")
    wildcard_constraints:
        method="|".join(uka_judged()),
    conda:
        env_file("lm-serve")
    threads: 4
    resources:
        **heavy_resources("infer_gpu", UKA, stage="win_rate"),
    params:
        settings=UKA_LLM,
        reference=UKA_REFERENCE,
        seeds=UKA["seeds"],
        code=code_param("lm-serve", "workflows/uka/scripts/win_rate.py"),
    script:
        "scripts/win_rate.py"


rule uka_report:
    input:
        **keyed("per_case", {(m,): uka_path("eval", m, "per_case.parquet") for m in UKA["methods"]}),
        **keyed("wins", {(m,): uka_path("eval", m, "win_rate.parquet") for m in uka_judged()}),
        **keyed("attempts", {(m,): uka_path("models", m, "attempts.csv") for m in uka_paper_trained()}),
    output:
        report=uka_path("report.md"),
        metrics=uka_path("metrics.json"),
        metrics_table=uka_path("metrics.parquet"),
        table_methods=report(uka_path("tables", "methods.csv"), category="uka", labels={"table": "methods"}),
        figure_success=report(uka_path("figures", "success.png"), category="uka", labels={"figure": "success rate"}),
    log:
        uka_path("logs", "report.log"),
    conda:
        env_file("base")
    threads: 1
    resources:
        **resources_of("cpu_light"),
    params:
        seeds=UKA["seeds"],
        pretrained=UKA["pretrained"],
        simulation=UKA["simulation"],
        critic=UKA["critic"],
        win_rate=UKA["win_rate"],
        scale=RUN.scale,
        claims=UKA["claims"],
        claims_not_measured=UKA["claims_not_measured"],
        code=code_param("base", "workflows/uka/scripts/report_paper.py"),
    script:
        "scripts/report_paper.py"
