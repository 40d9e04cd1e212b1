"""Stand-in for the get-pip.py that ansible-test downloads from Ansible's CI file server (not a package index).

ansible-test creates each sanity-test venv without pip and bootstraps pip with that script, which it looks for in
its cache first. scripts/sanity.sh puts this file in that cache slot: it installs the pip wheel bundled with CPython
(ensurepip, no network), then lets that pip install the requested pip version and packages from the package index,
exactly as the arguments ask.
"""

import subprocess
import sys

# get-pip.py's own switches: this bootstrap never installs setuptools or wheel, so they are dropped.
GET_PIP_ONLY = {"--no-setuptools", "--no-wheel"}


def main() -> int:
    subprocess.run([sys.executable, "-m", "ensurepip", "--default-pip"], check=True, stdout=subprocess.DEVNULL)
    args = [arg for arg in sys.argv[1:] if arg not in GET_PIP_ONLY]
    return subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", *args], check=False).returncode


if __name__ == "__main__":
    sys.exit(main())
