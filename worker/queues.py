"""The names the API and the GPU workers share: the run task and the queue it is sent on."""

RUN_JOB_TASK = "tunebox.run_job"
GPU_QUEUE = "gpu"
