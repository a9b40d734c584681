"""The rooms of a command's runs, each one responsibility: ``planning`` (the folder, preflight,
memory), ``execution`` (tasks on runtimes, the worker pool), ``detached`` (Flower runs submitted
and pulled later), ``sweeps`` (a study's tasks, locally or on Ray), ``report`` (plots, the
terminal table) and ``progress``. ``fedbandit.runner.run_experiment`` composes them."""
