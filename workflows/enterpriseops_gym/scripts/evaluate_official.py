from paperflow.core.io import write_frame
from paperflow.core.job import snakemake_job
from paperflow.enterpriseops_gym.official import episode_table

with snakemake_job(snakemake) as job:
    frame = episode_table(job.keyed("runs"))
    write_frame(job.output[0], frame, {"models": sorted(frame["agent"].unique())})
    job.note(episodes=len(frame), errored=int(frame["errored"].notna().sum()))
