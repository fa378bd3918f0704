"""Where and as whom a replica's `setup` and `run` run: SkyPilot's runtime, on EC2 and embedded.

SkyPilot runs a task as the image's default user (`ubuntu` on its Ubuntu images and AWS's Ubuntu
AMIs, with passwordless sudo), its workdir synced to `~/sky_workdir` and the commands started there,
each through a bash script that first sources `~/.bashrc` and conda's shell functions
(`make_task_bash_script`, sky/skylet/log_lib.py; SKY_REMOTE_WORKDIR, sky/skylet/constants.py). Its
YAMLs count on all of it: `sudo apt-get install`, `conda activate env || conda create ...`,
`cd ~/sky_workdir`, files written to `~` (`tee ~/server.log`).

A replica has the same: on EC2 the units run as RUN_USER (created, with passwordless sudo, on an
image that lacks it: fleetkeeper.reconciler.userdata) with HOME `/home/ubuntu` and the workdir
unpacked into `/home/ubuntu/sky_workdir`; embedded, HOME is the replica's own directory with
`sky_workdir` inside (fleetkeeper.local.process_driver). Either way `setup` and `run` are the
scripts `task_script` makes: SkyPilot's preamble, then the commands as written, with no `set -e`
added (SkyPilot adds none, and `conda activate x; if [ $? -ne 0 ]; then conda create ...` depends
on it).
"""

from __future__ import annotations

import re

# The user setup and run run as on EC2: the default user of Canonical's Ubuntu images and of AWS's
# Ubuntu Deep Learning AMIs, which cloud-init gives passwordless sudo.
RUN_USER = "ubuntu"
HOME = f"/home/{RUN_USER}"
# SkyPilot's SKY_REMOTE_WORKDIR (~/sky_workdir): the workdir is unpacked there, and setup and run start there.
WORKDIR_NAME = "sky_workdir"
WORKDIR = f"{HOME}/{WORKDIR_NAME}"

# Where conda goes on an image without it (SkyPilot's SKY_CONDA_ROOT, ~/miniconda3), and how: Miniforge
# (conda-forge's installer, the one SkyPilot's CONDA_INSTALLATION_COMMANDS uses) for this machine's
# architecture, from its GitHub releases (https://github.com/conda-forge/miniforge#install). SkyPilot
# YAMLs run `conda activate`/`conda create` and `pip` as if conda were there; Ubuntu's image and the
# base Deep Learning AMI have neither.
CONDA_ROOT = "$HOME/miniconda3"
_MINIFORGE = "https://github.com/conda-forge/miniforge/releases/latest/download/Miniforge3-Linux-$(uname -m).sh"
_CONDA_INSTALL = (
    f'if ! command -v conda > /dev/null 2>&1 && [ ! -x "{CONDA_ROOT}/bin/conda" ]; then\n'
    f'  curl -fsSL "{_MINIFORGE}" -o /tmp/miniforge.sh && bash /tmp/miniforge.sh -b -p "{CONDA_ROOT}"'
    " && rm -f /tmp/miniforge.sh\n"
    "fi\n"
)
_CALLS_CONDA = re.compile(r"(?<![\w.-])conda(?![\w.-])")

# What SkyPilot's task script does before the commands (log_lib.make_task_bash_script): the user's
# ~/.bashrc, conda's shell functions when conda is there (`set -a` exports them to subshells, so
# `conda activate` works in a script the commands start), unbuffered Python output, the workdir.
# ~/.bashrc returns at once in a shell that is not interactive (Ubuntu's does), so conda's own
# directory goes on PATH here, as `conda init` would have it.
_PREAMBLE = (
    "source ~/.bashrc > /dev/null 2>&1 || true\n"
    f'if [ -x "{CONDA_ROOT}/bin/conda" ]; then export PATH="{CONDA_ROOT}/bin:$PATH"; fi\n'
    "set -a\n"
    '. "$(conda info --base 2> /dev/null)/etc/profile.d/conda.sh" > /dev/null 2>&1 || true\n'
    "set +a\n"
    "export PYTHONUNBUFFERED=1\n"
    f"cd ~/{WORKDIR_NAME}\n"
)


def calls_conda(*commands: str | None) -> bool:
    """Whether any of the commands runs `conda` (as a word: not `miniconda3/` or `conda-forge`)."""
    return any(_CALLS_CONDA.search(text or "") for text in commands)


def task_script(commands: str | None, install_conda: bool = False) -> str:
    """`setup` or `run` as SkyPilot runs it: its preamble, then the commands (`true` when there are
    none). With `install_conda` (an EC2 replica's setup, when its setup or run calls conda), conda is
    installed first where the image has none."""
    return "#!/bin/bash\n" + (_CONDA_INSTALL if install_conda else "") + _PREAMBLE + (commands or "true") + "\n"
