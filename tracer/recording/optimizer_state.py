"""The storage roles the training loop brings into a trace after entry: the gradients an optimizer's step updates,
the state of an optimizer that entry did not find, and the parameters of modules outside `model=`."""

from tracer.recording import distributed
from tracer.recording.metadata import state_tensors
from tracer.safety import warn


class OptimizerState:
    """Gives storages their roles as optimizers step and modules outside the model run (tracer.recording.attribution's hooks
    call `started` and `external_module`).

    model            the traced model, or None.
    storages         the trace's tracer.recording.storage.StorageTable.
    roles            its tracer.recording.metadata.Roles.
    entry_optimizers ids of the optimizers `register_at_entry` found (None without a model): only ids, nothing kept alive.
    model_param_ids  ids of the model's parameters at entry."""

    def __init__(self, model, storages, roles, entry_optimizers, model_param_ids):
        self.model, self._storages, self._roles = model, storages, roles
        self._entry_optimizers, self._model_param_ids = entry_optimizers, model_param_ids
        self.found_late = 0  # bytes of optimizer state alive at entry that entry did not find (`started`)

    def external_module(self, module):
        """A module outside model= ran: its parameters get the storage role external_parameter."""
        own = {id(p) for p in self.model.parameters()} if self.model is not None else set()
        for p in module.parameters():
            if id(p) not in own:
                self._storages.id_of(p.untyped_storage())
                self._roles.add("external_parameter", p)

    def started(self, optimizer):
        """An optimizer's step begins: its parameters' gradients get their role. An optimizer of the model's parameters
        that entry did not find (tracer.recording.metadata LiveOptimizers) but whose state was alive then is named: its
        state counts in live_bytes only from its first op on."""
        params = [p for g in optimizer.param_groups for p in g["params"]]
        self._roles.gradients(params)
        if self._entry_optimizers is None or id(optimizer) in self._entry_optimizers:
            return
        self._entry_optimizers.add(id(optimizer))  # asked once per optimizer
        if not any(id(p) in self._model_param_ids for p in params):
            return  # not the model's: its state is never registered at entry (register_at_entry)
        unseen = {}
        for value in state_tensors(optimizer):
            try:
                storage = distributed.local_tensor(value).untyped_storage()
            except Exception:  # no storage (sparse, nested): never registered at entry either
                continue
            if self._storages.known(storage) is None:
                unseen[storage._cdata] = storage.nbytes()
        if unseen:
            late = sum(unseen.values())
            self.found_late += late  # the metadata's optimizer_state_found_late
            warn(
                f"optrace: the state of optimizer {type(optimizer).__name__} ({late:,} bytes in {len(unseen)} "
                "storage(s)) was alive when the Tracer was entered but was not found then; live_bytes before its "
                "step does not count it"
            )
