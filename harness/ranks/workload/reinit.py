"""reinit [new_port]: destroy_process_group, then init_process_group again in the same process,
on the same port or (``new_port``) on the run's second port, as a retry loop or a notebook
does; the rank says it joined again and its groups are gone."""

from __future__ import annotations

import os

from . import Running, StepKind


class Reinit(StepKind):
    NAME = "reinit"
    GRAMMAR = r"reinit( new_port)?"
    HELP = "'reinit [new_port]'"
    ABOUT = ("destroy_process_group then init_process_group again with the same arguments, on "
             "the same port or (new_port) the run's second one: MASTER_PORT and a tcp:// URL "
             "move to it")
    EXAMPLES = ("reinit", "reinit new_port")
    ORDER = 130

    def act(self, w: Running, entry: str) -> None:
        w.dist.destroy_process_group()
        kwargs = w.init_kwargs
        if entry.endswith("new_port"):
            port2 = w.spec.init.port2
            if port2 is None:
                raise RuntimeError("reinit new_port: the plan reserved no second port")
            old = os.environ.get("MASTER_PORT", "")
            os.environ["MASTER_PORT"] = str(port2)
            url = kwargs.get("init_method", "")
            if old and isinstance(url, str) and url.startswith("tcp://"):
                kwargs["init_method"] = url.replace(f":{old}", f":{port2}", 1)
        w.dist.init_process_group(**kwargs)
        w.groups.clear()
        w.joined()
