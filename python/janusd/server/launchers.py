"""The launchers by their config name (`devices.launcher`): server/launcher.py's local one
and server/ray_launcher.py's; Ray is imported only when the ray one starts (an optional
dependency: `pip install janusd[ray]`), so `janus serve` with the local one needs no Ray."""

from __future__ import annotations

from janusd.config import DevicesConfig, RayConfig
from janusd.server.launcher import Launcher, LocalLauncher


def make_launcher(devices: DevicesConfig, ray: RayConfig) -> Launcher:
    if devices.launcher == "ray":
        from janusd.server.ray_launcher import RayLauncher

        return RayLauncher(ray, devices.count)
    return LocalLauncher()
