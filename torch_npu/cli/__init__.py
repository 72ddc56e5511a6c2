"""``torch-npu`` (also ``python -m torch_npu``): the command-line tool.

Sub-commands, one module each:
  info       the emulated machine (devices, memory, versions)
  migrate    find CUDA-only code in Python files; --fix / --diff rewrite what is safe
  preflight  run a script for a bounded time on the virtual NPU and report what would hurt
  doctor     check the environment and what client libraries will detect
  env        the export lines of CANN's set_env.sh, for the emulated toolkit
"""
import click

# Relative imports, and torch only inside the commands that need it: the console script
# (torch_npu_cli.py) loads this package without importing torch_npu, so that `migrate`
# and `--help` start without torch.
from .doctor import doctor
from .env import env
from .info import info
from .migrate import migrate
from .preflight import preflight


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def cli():
    """torch_npu command-line tool (the NPU is emulated on the CPU)."""


for _command in (info, migrate, preflight, doctor, env):
    cli.add_command(_command)


def main(argv=None):
    """Console-script entry point; returns the exit code."""
    try:
        return cli.main(args=argv, prog_name="torch-npu", standalone_mode=False) or 0
    except click.exceptions.Exit as e:
        return e.exit_code
    except click.ClickException as e:
        e.show()
        return e.exit_code
    except click.exceptions.Abort:
        click.echo("Aborted!", err=True)
        return 1
