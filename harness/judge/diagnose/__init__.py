"""Diagnosis: what was observed of a run + its verdicts -> one line of cause per failed row (pure).

It sits above observe and classify, below expect and report: it reads the evidence (each
rank's exception, its TCP sockets at the deadline or at its end (harness.net.sockets), who held
the master port, the nft rules and kernel counters per host, the step log, stderr tails) and
writes ``Verdict.cause`` and ``Verdict.cause_evidence``: the cause in words and the evidence
lines it rests on. A row that ended ``ok`` or ``absent`` gets none.

The causes come from ``RULES``, an ordered table like the classifier's: the first rule that
returns a :class:`Cause` for a row decides; when none does, the cause is ``UNKNOWN``, said as
such (never a guess). A rule is a small function of a :class:`RankContext` in the module of its
area, registered by the ``@rule(order=..., evidence=...)`` decorator (``_core.py``): ``order``
places it in the table, where it should win over the rules after it.

* ``_core.py``: Cause, RankContext, the registry (``rule``, ``REGISTRY``, ``RULES``,
  ``load_rules``), ``diagnose`` and ``explain_run``;
* ``_shared.py``: helpers and patterns that rules of several modules read;
* the rule modules, by area: ``store`` (the TCP store and its port), ``filestore``
  (file://), ``network`` (sockets, firewall, routes, the fault proxy, shaped links), ``names``
  (DNS, hosts files), ``interfaces`` (gloo's and NCCL's interfaces and pairs), ``faulted``
  (what the faults did to the row itself), ``peers`` (a peer that died, froze or re-initialised),
  ``agents`` (torchrun's agents and workers), ``rendezvous`` (torchrun's rendezvous),
  ``parents`` (spawning parents, Slurm), ``workload`` (what the rank was told, its program,
  DDP), ``hang`` (the hang path: a row alive at the deadline).

Every module here whose name does not start with ``_`` is a rule module: ``load_rules`` imports
each, so a new one needs no list. Its public functions are rules (a helper's name starts with
``_``): tests/test_diagnosis_registry.py holds that, and that each rule has a kept real
observation in tests/data/diagnosis/.
"""

from __future__ import annotations

from ._core import (  # noqa: F401 - importable from the package, as before the split
    EADDRINUSE,
    EVIDENCE,
    REGISTRY,
    RULES,
    UNKNOWN,
    Cause,
    RankContext,
    Rule,
    RuleSpec,
    diagnose,
    explain_run,
    load_rules,
    rule,
)
from ._shared import (  # noqa: F401 - importable from the package, as before the split
    CLOSED,
    CONNECT_TIMEOUT,
    COUNTER,
    LOOPBACK_NAMES,
)
from .agents import (  # noqa: F401 - importable from the package, as before the split
    agent_after_its_workers,
    agent_child_failed,
    agent_waiting_for_workers,
    restart_read_stale_keys,
    stopped_by_agent,
)
from .faulted import (  # noqa: F401 - importable from the package, as before the split
    MEMORY,
    frozen_by_the_fault,
    interrupted_by_the_fault,
    killed_by_the_fault,
    out_of_descriptors,
    out_of_memory,
    raised_by_the_fault,
    starved_in_init,
)
from .filestore import (  # noqa: F401 - importable from the package, as before the split
    FILE_STORE_FAIL,
    file_store_never_opened,
    file_store_paths_differ,
    file_store_unusable,
    stale_file_store,
)
from .hang import (  # noqa: F401 - importable from the package, as before the split
    DIALLING,
    GAI_OF,
    GLOO_WAIT,
    HOSTING,
    NO_ROUTE_TRY,
    OWN_CODE,
    PROGRESS_WINDOW,
    RETRYING,
    SLEEPING,
    claimed_the_same_rank,
    dialling_a_store_nobody_hosts,
    hosting_a_store_nobody_joins,
    in_its_own_code,
    not_started_by_the_deadline,
    sigint_held_in_torch,
    still_progressing,
    teardown_gil_deadlock,
    the_store_shows_who_is_missing,
    waiting_for_a_peer_stuck_dialling,
    waiting_for_a_stuck_rank,
)
from .interfaces import (  # noqa: F401 - importable from the package, as before the split
    NCCL_DUP_GPU,
    NCCL_NO_IFACE,
    REMOTE,
    SPARE_STEP,
    gloo_interface_missing,
    gloo_on_a_link_local_card,
    gloo_pair_to_a_second_card,
    gloo_pair_to_no_host,
    nccl_interface_missing,
    nccl_ranks_share_a_gpu,
)
from .names import (  # noqa: F401 - importable from the package, as before the split
    GAI,
    NO_PEER_NAME,
    RESOLVER_FAULTS,
    name_unresolved,
    reverse_lookup_stalled,
)
from .network import (  # noqa: F401 - importable from the package, as before the split
    DOWN_STEP,
    LINK_FAULTS,
    LISTEN_SYSCTLS,
    NET_FAILURE,
    NET_UNREACHABLE,
    NO_ROUTE,
    SADDR_DROP,
    a_link_fault_in_force,
    cut_after_init,
    gloo_mesh_blocked,
    listen_queue_overflowed,
    no_route,
    partitioned,
    syn_unanswered,
    through_the_fault_proxy,
)
from .parents import (  # noqa: F401 - importable from the package, as before the split
    SLURM_STOPS,
    SRUN_ROW,
    parent_child_failed,
    srun_failed,
    stopped_by_slurm,
)
from .peers import (  # noqa: F401 - importable from the package, as before the split
    BARRIER_FAILED,
    END_SLACK,
    GLOO_SAYS,
    PEER_CLOSED,
    a_peer_was_frozen,
    barrier_peer_died,
    hung_with_a_dead_peer,
    mesh_peer_failed,
    peer_died,
    peer_reinitialised,
)
from .rendezvous import (  # noqa: F401 - importable from the package, as before the split
    INNER,
    RDZV_KEY,
    RDZV_SERVICE_BACKENDS,
    elastic_round_deadlock,
    redundant_agent_left,
    rendezvous_already_closed,
    rendezvous_join_timeout,
    rendezvous_service_faulted,
    rendezvous_store_lost,
)
from .store import (  # noqa: F401 - importable from the package, as before the split
    JOINED,
    PG_KEY,
    WAIT_KEYS,
    connected_to_a_non_store,
    joined_another_jobs_store,
    no_store_there,
    nobody_claimed_rank_0,
    refused_and_retried,
    store_host_failed,
    store_host_gone,
    store_port_in_use,
    waiting_for_a_rank_key,
    waiting_for_ranks,
    world_size_disagrees,
)
from .workload import (  # noqa: F401 - importable from the package, as before the split
    COLLECTIVE_TIMEOUT,
    CONFIG_EXC,
    CONFIG_MSG,
    ENV_MISSING,
    GLOO_RANK_CHECK,
    NOT_INT,
    a_peer_missed_the_collective,
    collectives_out_of_step,
    ddp_params_differ,
    ddp_unused_parameters,
    groups_disagree,
    program_exited,
    reinit_on_the_old_store,
    torch_refused_the_call,
    torch_refused_the_setup,
)

load_rules()   # and any rule module the imports above do not name
