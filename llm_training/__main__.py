"""Entry point: `python -m llm_training {train,validate,preprocess} ...` (also under torchrun and srun)."""

from joulebench.process_exit import exit_after_run
from joulebench.tensorflow_kept_out import keep_tensorflow_out

keep_tensorflow_out()  # before the framework imports: no TensorFlow log lines in a run that never uses it

from llm_training.cli import main  # noqa: E402

exit_after_run(main())
