"""Module names: the model's modules by dotted path, every other module by class and instance.

The model (`Tracer(model=...)`, or without it the first module that runs) is
named by its class (`GPT`) and its submodules by their dotted path from it
(`blocks.0.attn`), as `named_modules()` gives them. A module that is not part
of the model, and is not inside a module already named, is an *external root*:
`<ClassName>#<k>`, the k-th such instance of that class (from 1), with its own
submodules below it (`MLP#1.fc`). So a frozen teacher of the student's class is
`MLP#1` and its layers `MLP#1.fc`, never the student's `fc`; an external loss
module is `CrossEntropyLoss#1`, not a child of the model.

A torch.compile wrapper (`OptimizedModule`) takes the name of the module it wraps,
and the wrapper's `_orig_mod` level is dropped from paths (see tracer/compiled.py);
`compiled_seen` then says that compiled code ran, eagerly, under the tracer.
"""

import weakref

from tracer.compiled import compiled_original, strip_compiled, unwrap
from tracer.safety import WeakMap
from tracer.schema import EXTERNAL_MARK


class ModuleNames:
    """Names modules on first sight; `on_external(module)` is called for each new external root."""

    def __init__(self, model=None, on_external=None):
        self._names = WeakMap()  # no Python finaliser: a Ctrl-C cannot be lost in one (tracer/safety.py)
        self._model = lambda: None  # a weak reference: the tracer keeps nothing alive
        self._on_external = on_external
        self._instances = {}  # class name -> external roots of that class named so far
        self._external_roots = set()
        self.root_name = None
        self.compiled_seen = False  # a torch.compile'd module ran (eagerly, under the tracer)
        if model is not None:
            self._adopt(model)

    def name_of(self, module):
        name = self._names.get(module)
        return name if name is not None else self._name_new(module)

    def in_model(self, name):
        """Whether a module name belongs to the model's tree (not an external root's)."""
        return name.split(".", 1)[0] not in self._external_roots

    def is_ancestor(self, outer, inner):
        """Whether module `outer` contains module `inner` (by their names)."""
        if inner.startswith(outer + "."):
            return True
        return outer == self.root_name and inner != outer and self.in_model(inner)

    def _adopt(self, model):
        if compiled_original(model) is not None:
            self.compiled_seen = True
            original = unwrap(model)
            self._adopt(original)
            self._names[model] = self.root_name
            return
        self._model = weakref.ref(model)
        self.root_name = type(model).__name__
        self._names[model] = self.root_name
        self._name_children(model, "")

    def _name_children(self, module, base):
        for path, child in module.named_modules(remove_duplicate=False):
            if path and child not in self._names:
                self._names[child] = base + strip_compiled(path)
                self.compiled_seen |= compiled_original(child) is not None

    def _name_new(self, module):
        original = compiled_original(module)
        if original is not None:  # a wrapper is named as what it wraps
            self.compiled_seen = True
            name = self._names[module] = self.name_of(original)
            return name
        model = self._model()
        if model is None and self.root_name is None:  # no model=: the first module that runs is the model
            self._adopt(module)
            return self.root_name
        if model is not None:
            self._name_children(model, "")  # a submodule added to the model after tracing began
        name = self._names.get(module)
        if name is not None:
            return name
        cls = type(module).__name__
        k = self._instances[cls] = self._instances.get(cls, 0) + 1
        name = f"{cls}{EXTERNAL_MARK}{k}"
        self._names[module] = name
        self._external_roots.add(name)
        self._name_children(module, name + ".")
        if self._on_external is not None:
            self._on_external(module)
        return name
