"""``dynamo_export``: torchair's offline export."""
import os

__all__ = ["dynamo_export"]


def dynamo_export(*args, model, export_path="export_graphs", export_name="export", dynamic=False,
                  config=None, **kwargs):
    """On hardware: writes an offline GE model (air). Here: exports the program
    with ``torch.export`` and saves it as ``<export_path>/<export_name>.pt2``;
    returns that path."""
    import torch
    ep = torch.export.export(model, tuple(args), kwargs or None)
    os.makedirs(export_path, exist_ok=True)
    path = os.path.join(export_path, export_name + ".pt2")
    torch.export.save(ep, path)
    return path
