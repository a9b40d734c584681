"""Executors: where the independent tasks of a study (one ``RunSpec`` each) run. Each executor
returns every task's result files to the driver, which writes them
(``fedbandit.results.files.write_files``)."""
