"""``torch-npu env``: the ``export`` lines CANN's ``set_env.sh`` would print, for the emulated toolkit.

``eval "$(torch-npu env)"`` gives a shell (and every program it starts, ``pip install
deepspeed`` included) the CANN environment that ``import torch_npu`` otherwise sets only
for its own process and children.
"""
import click


@click.command("env")
@click.option("--path", "show_path", is_flag=True, help="print only the toolkit directory (ASCEND_HOME_PATH)")
def env(show_path):
    """Print the CANN environment (export lines) pointing at the emulated toolkit."""
    from torch_npu.utils import _cann_env
    try:
        home = _cann_env.toolkit_home()
    except OSError as e:
        raise click.ClickException(str(e))
    click.echo(home if show_path else "\n".join(_cann_env.export_lines(home)))
