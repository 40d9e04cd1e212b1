"""Import a built collection tarball with galaxy-importer, as Galaxy and Automation Hub do on upload.

    <importer venv>/bin/python scripts/galaxy_import.py check TARBALL
        the tarball as `make build-collection` builds it: the import must fail on the missing repository URL
        only (galaxy.yml names none until the project has a public home), with nothing else wrong
    <importer venv>/bin/python scripts/galaxy_import.py release URL TARBALL OUTPUT_DIR
        the release step: the same tarball rebuilt with galaxy.yml's `repository` set to URL, into OUTPUT_DIR;
        its import must pass

Every warning the importer gives must be one of KNOWN (each says why it stays, docs/publishing.md); any other
warning, and any error, fails. The importer runs flake8, ansible-doc and ansible-lint as Automation Hub does
(ansible-test sanity needs a container there; `make sanity` runs it on the installed collection instead).
"""

import json
import logging
import os
import re
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

MISSING_REPOSITORY = "Invalid collection metadata. 'repository' is required"
TARBALL_NAME = re.compile(r"^(?P<namespace>\w+)-(?P<name>\w+)-(?P<version>[0-9A-Za-z.+-]+)\.tar\.gz$")
URL = re.compile(r"^https://[^\s/]+\.[^\s/]+/\S+$")


class Known(NamedTuple):
    label: str
    pattern: re.Pattern
    reason: str


KNOWN = (
    Known("flake8 E999 on filter docs", re.compile(r"^plugins/filter/\w+\.yml:\d+:\d+: E999 SyntaxError: .+$"),
          "the importer's flake8 reads each filter's YAML documentation (plugins/filter/<filter>.yml, the form "
          "ansible-doc reads for a file of several filters) as Python"),
    Known("flake8 W503", re.compile(r"^plugins/.+\.py:\d+:\d+: W503 line break before binary operator$"),
          "a long condition breaks before its operator, as PEP 8 recommends; the importer's flake8 selects both "
          "W503 and W504, of which every such break trips one"),
    Known("ansible-lint cannot find an own playbook",
          re.compile(r"^ERROR\s+Failed to find orbite\.qualification\.(?P<playbook>\w+) playbook\.$"),
          "the importer gives ansible-lint ANSIBLE_COLLECTIONS_PATH=<unpacked>/ansible_collections, from which "
          "ansible-lint resolves modules and roles but no playbook by FQCN (ansible-playbook does): the AWX example "
          "imports the collection's own playbook; `make lint` finds and lints it"),
    Known("sanity ignore files",
          re.compile(r"^Ignore files skip ansible-test sanity tests, found ignore-2\.\d+\.txt with \d+ statement\(s\)$"
                     ),
          "validate-modules wants a GPLv3 header in every module; the collection is Apache-2.0, so each ignore file "
          "holds that one statement per module and nothing else (tests/unit/repo/test_galaxy_import.py)"),
)


class Recorder(logging.Handler):
    """Keeps the importer's warnings and errors, and prints every message as the importer's CLI does."""

    def __init__(self):
        super().__init__(logging.INFO)
        self.warnings = []
        self.errors = []

    def emit(self, record):
        message = record.getMessage()
        if record.levelno >= logging.ERROR:
            self.errors.append(message)
        elif record.levelno >= logging.WARNING:
            self.warnings.extend(line.strip() for line in message.splitlines() if line.strip())
        if record.levelno >= logging.WARNING or not message.startswith(("Loading ", "Linting ")):
            print(message if record.levelno == logging.INFO else f"{record.levelname}: {message}", flush=True)


def classify(warnings, playbooks):
    """({label: count} of the known warnings, [the unexplained ones]); `playbooks` are the tarball's."""
    counts, unexplained = {}, []
    for warning in warnings:
        known = next((entry for entry in KNOWN if entry.pattern.match(warning)), None)
        match = known.pattern.match(warning) if known else None
        if known is None or ("playbook" in known.pattern.groupindex and match["playbook"] not in playbooks):
            unexplained.append(warning)
        else:
            counts[known.label] = counts.get(known.label, 0) + 1
    return counts, unexplained


def tarball_playbooks(tarball):
    with tarfile.open(tarball) as archive:
        names = archive.getnames()
    return {Path(name).stem for name in names if re.fullmatch(r"(\./)?playbooks/\w+\.ya?ml", name)}


def importer_config(work_dir):
    # Imported here: only the importer's own venv has galaxy_importer.
    from galaxy_importer import config  # noqa: PLC0415

    return config.Config(config_data={
        "run_flake8": True, "run_ansible_doc": True, "run_ansible_lint": True, "offline_ansible_lint": True,
        "run_ansible_test": False, "check_required_tags": False, "tmp_root_dir": str(work_dir),
        "ansible_local_tmp": str(Path(work_dir) / "ansible-tmp"),
    })


def run_import(tarball):
    """(Recorder, the import error or None) of one import of `tarball`."""
    from galaxy_importer import collection, exceptions  # noqa: PLC0415

    match = TARBALL_NAME.match(Path(tarball).name)
    if not match:
        raise SystemExit(f"galaxy_import: {tarball}: not a collection tarball name <namespace>-<name>-<version>.tar.gz")
    # The importer finds flake8, ansible-doc and ansible-lint on PATH: those of its own venv.
    os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    # As on Galaxy's servers: nothing of this checkout (make exports ANSIBLE_CONFIG, whose collections path holds
    # the checkout) nor of the user's ~/.ansible may resolve a name the tarball's own content should.
    for name in [name for name in os.environ if name.startswith("ANSIBLE_")]:
        del os.environ[name]
    logger = logging.getLogger("galaxy_import")
    logger.setLevel(logging.INFO)
    recorder = Recorder()
    logger.addHandler(recorder)
    with tempfile.TemporaryDirectory(prefix="orbite-galaxy-import-") as work_dir, open(tarball, "rb") as file:
        os.environ["HOME"] = work_dir
        try:
            collection.import_collection(file, collection.CollectionFilename(*match.groups()), logger=logger,
                                         cfg=importer_config(work_dir))
        except exceptions.ImporterError as error:
            return recorder, str(error)
        finally:
            logger.removeHandler(recorder)
    return recorder, None


def verdict(tarball, expected_error):
    """0 when the import of `tarball` fails with `expected_error` (None: passes) and every warning is known."""
    start = time.monotonic()
    recorder, error = run_import(tarball)
    counts, unexplained = classify(recorder.warnings, tarball_playbooks(tarball))
    problems = [f"unexplained warning: {warning}" for warning in unexplained]
    if error != expected_error:
        problems.append(f"import error {error!r}, expected {expected_error!r}")
    problems += [f"error: {message}" for message in recorder.errors if message != expected_error
                 and not (expected_error and expected_error in message)]
    known = ", ".join(f"{label}: {count}" for label, count in counts.items()) or "none"
    print(f"galaxy_import: {Path(tarball).name}: {time.monotonic() - start:.0f} s, import "
          f"{'failed: ' + error if error else 'passed'}; known warnings ({known})")
    for problem in problems:
        print(f"galaxy_import: {problem}", file=sys.stderr)
    return 1 if problems else 0


def release_galaxy_yml(galaxy_yml, repository):
    """galaxy.yml's text with `repository` set; ValueError naming the field, value and rule when it is no URL."""
    if not URL.match(repository):
        raise ValueError(f"repository={repository!r}: must be the collection's https:// URL "
                         "(e.g. https://github.com/<owner>/<repo>)")
    if re.search(r"^repository:", galaxy_yml, re.MULTILINE):
        raise ValueError("galaxy.yml names a repository already: release without REPOSITORY=")
    return f"{galaxy_yml.rstrip()}\nrepository: {json.dumps(repository)}\n"


def release_build(repository, tarball, output_dir, galaxy_yml_path):
    """Rebuild `tarball` (what `make build-collection` built) with galaxy.yml naming `repository`: the files are
    the tarball's, so the release ships exactly what was tested. Returns the new tarball's path."""
    text = release_galaxy_yml(Path(galaxy_yml_path).read_text(encoding="utf-8"), repository)
    with tempfile.TemporaryDirectory(prefix="orbite-release-") as source:
        with tarfile.open(tarball) as archive:
            # Our own build; the "data" filter where this Python has it (3.11.4 and later).
            archive.extractall(source, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
        for generated in ("MANIFEST.json", "FILES.json"):
            (Path(source) / generated).unlink()
        (Path(source) / "galaxy.yml").write_text(text, encoding="utf-8")
        Path(output_dir).mkdir(parents=True, exist_ok=True)
        subprocess.run([Path(sys.executable).parent / "ansible-galaxy", "collection", "build", "--force",
                        "--output-path", str(output_dir), source], check=True, stdout=subprocess.DEVNULL)
    return Path(output_dir) / Path(tarball).name


def main(argv):
    if argv[:1] == ["check"] and len(argv) == 2:
        return verdict(argv[1], MISSING_REPOSITORY)
    if argv[:1] == ["release"] and len(argv) == 4:
        repository, tarball, output_dir = argv[1:]
        try:
            built = release_build(repository, tarball, output_dir, Path(__file__).resolve().parent.parent /
                                  "galaxy.yml")
        except ValueError as error:
            print(f"galaxy_import: {error}", file=sys.stderr)
            return 2
        print(f"galaxy_import: built {built} (repository {repository})")
        return verdict(built, None)
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
