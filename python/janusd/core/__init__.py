"""The request path as a clock-injected core: admission, queues, assignment, token batches,
request end, failures. No asyncio, no sockets, no clock reads; the daemon (server/) and the
simulator drive it.

This package's names are the core's face to its shells: server/ and sim/ import the core
from here only, never its modules (tests/test_shell_faces.py checks), so what a shell may
call is listed once, below. Of a ServingCore a shell calls the methods (core/serving.py's
views for what it reads), never its parts (registry, requests, dispatch, ...)."""

from janusd.core.dispatch import DeclinedYield, InstanceFigure, Refusal
from janusd.core.registry import Instance, Model, Registry
from janusd.core.requests import Failure, Refused, Request, no_instance, removed
from janusd.core.serving import ServingCore
from janusd.core.shell_hooks import Limits, Observers
from janusd.core.submission import Submission

__all__ = ["DeclinedYield", "Failure", "Instance", "InstanceFigure", "Limits", "Model", "Observers", "Refusal", "Refused", "Registry",
           "Request", "ServingCore", "Submission", "no_instance", "removed"]
