"""Measurement data: readers of the shared layout (``datasets``), the traces of NeuSight's models read as
origin measurements (``neusight``), and measuring new rows on this machine (``collect``, with the
configurations it draws in ``op_configs``)."""
