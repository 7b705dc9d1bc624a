"""Formatting shared by the scenario renderers."""


def mib(b):
    return f"{b / 2**20:.1f} MiB"
