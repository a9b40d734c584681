"""What a Flower run leaves behind to be read back later: the run's record in its log
(``RUN_RECORD``, sent by the ServerApp with a seed's files, split off by the driver) and the
ServerApp's copy of a seed's files on its own host (``SERVER_RESULTS_VARIABLE``).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from fedbandit.flower.job import FlowerJob, job_to_json

# fedbandit.results (pandas, a fifth of a second) is imported by keep_on_server, which writes a
# seed's files: the CLI imports this module (SERVER_RESULTS_VARIABLE) and stays quick to import
# for `fedbandit --help`.

#: The file of every seed's emission in the run's log that describes the run (its job and the
#: seeds of the command): what ``fedbandit pull --run-id`` rebuilds a lost folder from. The
#: driver never writes it into its folder.
RUN_RECORD = ".fedbandit-run.json"
#: Set on the SuperLink host (``fedbandit superlink --results-dir DIR``): the folder where the
#: ServerApp also keeps a copy of every seed's files, under the driver folder's name. Unset: the
#: ServerApp writes no file (the results always reach the driver through the run's log).
SERVER_RESULTS_VARIABLE = "FEDBANDIT_SERVER_RESULTS"


def split_record(files: dict[str, str]) -> tuple[dict[str, object] | None, dict[str, str]]:
    """An emission's run record (``RUN_RECORD``, parsed; None when the ServerApp sent none) and
    its result files."""
    files = dict(files)
    record = files.pop(RUN_RECORD, None)
    return (json.loads(record) if record is not None else None), files


def run_record(job: FlowerJob, context: object) -> dict[str, str]:
    """For the ServerApp: ``RUN_RECORD`` of a finished seed's emission, as (path, text): the
    Flower run id, the seed's job and every seed of the run (a detached run's jobs, else this
    one), so that the run's log alone can rebuild the driver's folder (``fedbandit pull
    --run-id``). ``context`` is the ServerApp's Flower ``Context``."""
    jobs = str(context.run_config.get("jobs", ""))  # type: ignore[attr-defined]
    specs = [json.loads(text)["spec"] for text in json.loads(jobs)] if jobs else []
    runs = [f"{spec['algorithm']}/seed_{spec['seed']}" for spec in specs] or [
        f"{job.algorithm}/seed_{job.spec.seed}"
    ]
    record = {
        "flower_run": int(context.run_id),  # type: ignore[attr-defined]
        "job": job_to_json(job),
        "runs": runs,
    }
    return {RUN_RECORD: json.dumps(record, sort_keys=True)}


def server_result_dir(root: Path, hint: str, run_id: int) -> Path:
    """Where the ServerApp keeps its copy: ``root`` (the operator's folder on the SuperLink
    host) and the driver folder's name, reduced to letters, digits, ``.``, ``_`` and ``-``
    (``flower-run-ID`` when nothing is left): a driver names a folder, never a path."""
    name = "".join(c if c.isalnum() or c in "._-" else "_" for c in hint).lstrip(".")
    return Path(root) / (name or f"flower-run-{run_id}")


def keep_on_server(context: object, files: dict[str, str]) -> Path | None:
    """For the ServerApp: a copy of a seed's files on its own host, in ``server_result_dir``,
    when the operator set ``SERVER_RESULTS_VARIABLE`` there; the folder, or None. A folder that
    cannot be written is a warning in the run's log, never a failed seed: the files reach the
    driver through the log whatever happens here."""
    from fedbandit.results.files import write_files

    root = os.environ.get(SERVER_RESULTS_VARIABLE, "")
    if not root:
        return None
    hint = str(context.run_config.get("result-hint", ""))  # type: ignore[attr-defined]
    folder = server_result_dir(Path(root), hint, int(context.run_id))  # type: ignore[attr-defined]
    try:
        write_files(folder, files)
    except OSError as err:
        print(
            f"fedbandit: warning: no copy of the results kept in {folder} on this host "
            f"({err.strerror or err}); they reach the driver through the run's log",
            file=sys.stderr,
        )
        return None
    return folder
