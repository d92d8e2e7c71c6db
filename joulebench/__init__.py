"""joulebench: what the benchmark drivers and workflows share, and (in joulebench.analysis) what reads their results.

The core (this package, outside `analysis`) holds the run record and its metrics, the launch
environment, run control, torch device facts, the peak table, the drivers' policy on top of the
meter (steady-window sizing, the shared phase names and their replay, command-line types, the error
boundary naming the extras) and the serving records' per-request table and energy fit; it builds on
the meter `jpwr`, through its public names only. Drivers import the core, never `joulebench.analysis`.

The core's API for the drivers (llm_training, resnet50, llm_inference) and the workflows (jube/) is `API`
below: per module, the names they may import, each with the reason they need it. Every other name of the
core is its own (and analysis', which reads records beside it); tests/test_architecture.py fails when a
driver or jube imports a core name not declared here, or when a declared name is no longer imported.
See docs/architecture.md ("The core's API").
"""

from jpwr import __version__

__all__ = ["__version__"]

# module -> {name: why a driver or jube/ needs it}
API: dict[str, dict[str, str]] = {
    # one run's life, written once for every driver (docs/architecture.md, "One run lifecycle")
    "joulebench.lifecycle": {
        "Lifecycle": "the driver process: signals, its run records and its exit code",
        "Run": "one run record in the making, as the driver's code receives it",
        "RunFailed": "a run that cannot go on, with its reason and fix",
        "StopRequest": "why this rank stops early, asked at the loop's step boundaries",
        "StopRequested": "a loop's clean stop at a step boundary after its window closed",
        "amend_written_record": "a sweep's later fit added to records already written",
        "default_out_dir": "where every driver writes without --out-dir",
        "new_run_id": "the run id every driver gives a record, sortable by time",
        "sweep": "every point of a driver's sweep, one record each",
        "fallback_paths": "where the job's finalizer writes a record its directory cannot take",
        "write_elsewhere": "the job's finalizer writes a record to the first fallback path",
    },
    "joulebench.loop": {
        "run_loop": "the training drivers' one loop: warm-up and steady windows, stops at log points",
        "LoopSpec": "what the training loop needs of the driver's configuration",
        "LoopResult": "what the training loop hands back: losses, completed and planned steps",
        "TrainSteps": "the training driver's side of the loop (a step, the loss, collectives)",
        "Progress": "rank 0's progress lines of a training loop",
        "STEP_TIMES_BASIS": "how the training loop's step times were taken, stated in the record",
    },
    "joulebench.launch": {
        "LaunchEnv": "the process's rank layout under torchrun, srun or alone",
        "expand_nodelist": "Slurm's compressed host list for TensorFlow's cluster spec",
        "tasks_on_node": "Slurm's tasks per node for TensorFlow's cluster spec",
    },
    "joulebench.boundary": {"exit_code_of": "every driver's command behind jpwr's error boundary, naming the extras"},
    "joulebench.process_exit": {"run_driver": "a driver's `python -m`: its command line run behind the error "
                                              "boundary, imports included, and its process ended once its records "
                                              "are written"},
    "joulebench.out_dir": {"check_out_dir": "refuses an output directory that cannot be written, before any work"},
    # torch.compile's caches kept between runs, and what the compile cost (the drivers that compile)
    "joulebench.compile_cache": {
        "add_compile_cache_argument": "--compile-cache, one option of every driver that torch.compiles",
        "check": "refuses a cache directory that cannot hold the caches, before any work",
        "CompileCache": "the checked caches a run activates and reports in its record",
        "compile_seconds": "the record's compile_s: the warm-up window of a run that compiles",
        "FirstStepCompile": "the record's split of the first step by torch's own compile timers",
        "frame_compiles": "dynamo's compiles so far: counted after a set-up, it shows whether a window compiled",
    },
    "joulebench.progress": {"Heartbeat": "a line now and then while a long driver phase runs"},
    "joulebench.waits": {
        "wait_until": "every wait of a run, in slices that hear a stop request",
        "StopCheck": "the type of the stop question a wait asks",
    },
    "joulebench.bounded_run": {"stop_group": "a process group the driver started (a serving run's server) ended "
                                             "as Slurm ends a job: SIGTERM, a grace period, SIGKILL"},
    # the run record: written by the drivers, finalized and tabled by jube/
    "joulebench.record": {
        "RunRecord": "the one record every driver writes and jube reads",
        "steady_metrics": "the steady window's figures every driver's metrics start from",
        "RECORD_FILE": "the record's file name, where drivers and jube look for it",
        "read_run_record": "reads and checks a written record (jube's tables, a later fit)",
        "write_run_record": "the job's finalizer writes a record by the same rules as the drivers",
        "EXIT_CODES": "a status's exit code, the job script's too",
        "RECORD_NOT_WRITTEN": "the exit code of a record written elsewhere than asked",
        "STATUSES": "the statuses a record may have, checked by the finalizer",
        "headline_domain": "the energy domain a table row's figures are of",
        "driver_metrics": "a record's metrics as its driver's type, before a driver's own key is read",
    },
    "joulebench.record_types": {
        "HeldOutHalfCheck": "a held-out half's typed check, recorded without and with the power-cap term",
        "SteadyFigures": "the steady window's headline figures each driver's metrics start from",
        "TrainingMetrics": "llm_training's typed metrics block",
        "ResNetMetrics": "resnet50's typed metrics block",
        "InferenceRunMetrics": "an llm_inference run's (static batches) typed metrics block",
        "LoadMetrics": "an llm_inference load's typed metrics block, one offered rate",
        "CrossRateCheck": "the per-request model's check (a) row that llm_inference writes",
        "ControlledPartCheck": "the per-request model's check (c) row that llm_inference writes",
        "ControlledPlan": "how llm_inference planned the controlled-split window's parts",
        "ControlledPart": "one part of the controlled-split window as llm_inference measured it",
        "ControlledWindowBlock": "the controlled-split window in the serving record's energy block",
        "ClientEstimateError": "the client-side estimate's error llm_inference measures against its engine",
        "RequestsBlock": "the serving record's typed requests block",
        "RequestFailures": "an HTTP load's failed and timed-out requests in the record",
        "OutputTokenCounts": "an HTTP load's counted output tokens in the record",
        "ResNetFlopsFigures": "ResNet-50's FLOP counts of one image in the record",
        "HardwareBlock": "the typed hardware block a driver fills with what it ran on",
        "JobBlock": "the typed job block jube's finalizer fills",
        "JobNode": "one node's accelerators metered as the job's, in the job block",
        "FootprintBlock": "the typed footprint block jube's finalizer estimates",
        "RequestEnergyBlock": "the serving record's typed per-request energy block, fitted by llm_inference",
    },
    "joulebench.record_shape": {
        "checked_block": "a block built from untyped parts (jpwr's dicts, settings) becomes its typed block, checked",
    },
    "joulebench.figures": {
        "rejection": "why a record's figures cannot be used: jube's table flags them as analysis does",
        "REJECTED": "the word a table cell shows for rejected figures",
        "is_number": "a record value that is a number (not a bool, not text)",
        "MIN_COUNTER_PERIODS": "the fewest energy counter periods a window needs, the rejection's threshold",
        "work_devices": "the devices that did a run's work: every per-device throughput divides by them",
    },
    "joulebench.reasons": {
        "clip": "a reason cut at a word to a table cell's width",
        "short_note": "several reasons' heads in one table cell",
    },
    "joulebench.disturbed": {"summary": "one phrase saying a run was disturbed, for jube's tables"},
    "joulebench.latents": {"steady_latents": "mean clocks and utilisation of the steady window from the traces"},
    "joulebench.device_settings": {"Request": "the GPU settings a sweep point asks for, stated in its record"},
    "joulebench.device_settings.record": {
        "RECORD_KEY": "the record block of the GPU settings a run had",
        "recorded_settings": "the GPU settings a record states, for jube's table",
    },
    # the sweep settings, declared once (a new one is a row there and its driver option; docs/architecture.md)
    "joulebench.sweep_settings": {
        "sweep_keys": "a workflow's sweep dimensions, in its XML's order",
        "passed_as_given": "the sweep dimensions a point passes to its driver as they are",
        "settings_of": "the rows jube/jbcolumns.py writes the XML's sweep parameters from",
        "work_unit": "a workflow's unit where a record names none",
    },
    # command lines: the same options, types and ranges in every driver
    "joulebench.arguments": {
        "Number": "a numeric option's type with both ends stated (jpwr's)",
        "state_ranges": "appends each numeric option's range to its help (jpwr's)",
        "method_names": "the --energy-methods type naming jpwr's methods (jpwr's)",
        "COUNT": "the range of counts: iterations, requests, batches (jpwr's)",
        "COUNT_OR_ZERO": "the range of counts where 0 means off (jpwr's)",
        "NODES": "the range of node and device counts (jpwr's)",
        "SECONDS": "the range of a duration in seconds (jpwr's)",
        "SECONDS_OR_ZERO": "the range of a duration where 0 means off (jpwr's)",
        "PORT": "the range of a TCP port (jpwr's)",
        "SEED": "the range numpy and torch seeds accept",
        "SIZE": "the range of model and batch dimensions and tokens",
        "MINUTES": "the range of --exit-duration-mins",
        "MILLISECONDS": "the range of a latency objective",
        "GIB": "the range of device memory in GiB",
        "LEARNING_RATE": "the range of a learning rate",
        "LOG_INTERVAL": "the range of a progress-line interval, where the loop hears a stop",
        "LOSS_SCALE": "the range of a mixed-precision loss scale",
        "FACTOR": "the range of weight decay, a gradient clip, a floor learning rate",
        "POSITIVE_FACTOR": "the range of Adam's epsilon and the init std (above zero)",
        "PROBABILITY": "the range of dropout and Adam's betas",
        "SameMeaning": "an option meaning the same as others (a sweep and its one point)",
        "comma_list": "a comma-separated option whose empty items are refused",
    },
    "joulebench.sizing": {
        "add_window_arguments": "--steady-seconds and --idle-baseline, worded the same in every driver",
        "check_warmup_for_timing": "a window sized by time needs a warm-up step to time",
        "window_length": "the seconds a steady window aims at, from the meter's live readings",
        "WindowLength": "those seconds with the rule that set them, for the record",
        "MIN_SECONDS": "the shortest steady window, in validate's estimate of a run",
        "ASSUMED_UPDATE_S": "the sensor update period a CPU run's window states (assumed)",
    },
    "joulebench.exports.targets": {"add_log_to": "the drivers' shared --log-to option"},
    # the device and the host a driver runs on
    "joulebench.torch_device": {
        "resolve_device": "the torch device for auto, cuda or cpu, refused without a GPU",
        "device_type": "the device type validate checks a run for",
        "hardware_info": "what the run ran on, for the record",
        "no_gpu_error": "the same words from every framework when no GPU is seen",
    },
    "joulebench.peaks": {"peak_flops": "the device's dense peak FLOP/s for MFU"},
    "joulebench.node_facts": {"gpu_node_facts": "the node's GPU interconnect, for the record"},
    "joulebench.host_memory": {
        "available_gib": "the host's free memory, checked by validate before a run",
        "HOST": "how a message names the host's memory",
    },
    "joulebench.tensorflow_free": {
        "tensorboard_without_tensorflow": "TensorBoard event files without importing TensorFlow",
    },
    # phases a training driver times and replays (docs/attribution.md)
    "joulebench.phases": {
        "FORWARD": "the shared name of the forward phase",
        "BACKWARD": "the shared name of the backward phase",
        "OPTIMIZER": "the shared name of the optimizer phase",
        "GRAD_REDUCE": "the shared name of the gradient reduction phase",
        "PIPELINE_P2P": "the shared name of the pipeline's point-to-point phase",
        "Replay": "one phase run alone for the replay estimator",
        "replay_phases": "runs each phase alone in its own window",
        "check_replay_seconds": "refuses a replay no sampler would meter",
    },
    # a serving run's per-request table and energy (llm_inference's; analysis reads them too)
    "joulebench.requests_table": {
        "RequestsTable": "a serving run's per-request table and step log beside its record",
        "save_requests": "writes the table beside the record atomically",
        "read_requests": "reads a table back for the per-request fit",
        "FILE_NAME": "the table's file name beside the record",
        "REQUEST_COLUMNS": "the table's columns and what each holds",
        "RequestStatus": "how the table stores a request's end",
        "StepKind": "how the step log stores an engine step's kind",
    },
    "joulebench.request_energy": {
        "fit_request_energy": "fits per-request energy on the counter segments of a window",
        "fit_with_clock_trial": "the fit with and without the card-state term",
        "fit_with_cap_trial": "the fit with and without the power-cap term, beside the clock term's",
        "COLUMNS": "the work columns the power-cap term's step-time law is recorded over",
        "request_parts": "splits a window's energy over its requests",
        "cross_check": "tests a fit on another rate's measured window",
        "controlled_split_check": "tests a fit on a window of separate prefill and decode",
        "RequestEnergyFit": "a fit's costs, bootstrap draws and what it can separate",
        "RequestParts": "each request's energy in parts with intervals",
        "WorkLog": "the engine's step log the fit reads",
        "HeldOutWindow": "another rate's window to test a fit on",
        "SPLIT_SLACK": "the controlled split check's tolerance, which sets how long its measured parts last",
        "measured_energy": "the counter energy of one controlled part with its own bound",
        "work_conditions": "the card state and step sizes of the controlled parts, for the record",
    },
    "joulebench.joint_energy": {
        "fit_joint": "one fit of per-request costs across a sweep's rates",
        "fitted_rates": "the rates a joint fit can take, and why others are left out",
        "RateWindow": "one rate's steps, counter and span for the joint fit",
        "JointFit": "the joint fit's per-rate views, whose checks each rate's record carries",
        "MIN_RATES": "the fewest rates a joint fit needs",
    },
    "joulebench.clock_term": {"TermTrial": "the card-state term as fitted and as it predicted held-out rates"},
    "joulebench.cap_term": {"CapTrial": "the power-cap term as fitted, its checks and held-out rates"},
    "joulebench.card_state": {
        "CardState": "one device's clock readings the card-state term uses",
        "check_fields": "a check's record fields, with a failure's measured cause",
    },
    "joulebench.segment_fit": {
        "counter_knots": "the energy counter's knots in a node's trace",
        "window_segments": "the counter segments inside a window",
        "Segments": "the type of those segments, which llm_inference measures parts of a window on",
    },
}
