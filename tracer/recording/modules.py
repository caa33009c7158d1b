"""Module names: the model's modules by dotted path, every other module by class and instance, or by its caller.

The model (`Tracer(model=...)`, or without it the first module that runs) is
named by its class (`GPT`) and its submodules by their dotted path from it
(`blocks.0.attn`), as `named_modules()` gives them.

A module outside the model that a module calls (one that is not that module's
registered submodule) is named in its caller's subtree, by its class, per call:
a kernel-hub wrapper built inside `blocks.3.mixer`'s forward is
`blocks.3.mixer.Func`, a loss module built inside the root's forward is
`CrossEntropyLoss` (a child of the root, as `lm_head` is). Several such modules
of one class in one call of the caller are told apart by the order they are
first called in it: `blocks.3.mixer.Func`, `blocks.3.mixer.Func~1` (the same
object called again in that call keeps its name). So the same call site gets the
same name in every step and every call of the caller, whether the module is
built anew each time or shared by several callers. Its submodules follow it by
their paths (`blocks.3.mixer.Func.conv`).

A module outside the model run outside every module is an *external root*:
`<ClassName>#<k>`, with its own submodules below it (`MLP#1.fc`). So a frozen
teacher of the student's class is `MLP#1` and its layers `MLP#1.fc`, never the
student's `fc`; an external loss module is `CrossEntropyLoss#1`, not a child of
the model. k is the smallest from 1 whose module is gone and that no external
root was given in this step: a loss module built anew in each step of the loop
is `CrossEntropyLoss#1` in every step, while a teacher kept alive keeps `MLP#1`.

A torch.compile wrapper (`OptimizedModule`) takes the name of the module it wraps,
and the wrapper's `_orig_mod` level is dropped from paths (see tracer.recording.compiled);
`compiled_seen` then says that compiled code ran, eagerly, under the tracer.

Known limitation: a module added to the model after tracing began is found by a
walk of the model that a module outside it runs once per step (outside every
module: at each new one); added and called in a step after that walk, it is
named as a module outside the model in that step.
"""

import weakref

from tracer.recording.compiled import compiled_original, strip_compiled, unwrap
from tracer.safety import WeakMap
from tracer.schema import EXTERNAL_MARK

CALL_MARK = "~"  # `Func~1`: the second module of class Func its caller called in one call


class ModuleNames:
    """Names modules; `on_external(module)` is called once for each module outside the model that runs."""

    def __init__(self, model=None, on_external=None):
        self._names = WeakMap()  # no Python finaliser: a Ctrl-C cannot be lost in one (tracer.safety)
        self._model = lambda: None  # a weak reference: the tracer keeps nothing alive
        self._on_external = on_external
        self._external_roots = set()
        self._root_holders = {}  # external root name -> weak reference to the module named so (its submodules follow)
        self._given_in_step = set()  # external root names given to a module in this step
        self._outside = WeakMap()  # modules outside the model seen so far (each told to on_external once)
        self._walked = False  # the model was walked for new submodules in this step
        self._calls = {}  # caller name -> (WeakMap module -> name, {class name: count}) for the caller's current call
        self._callers = {}  # name given in a caller's subtree -> that caller's name
        self._holders_in = {}  # name given in a caller's subtree -> weak reference to the module last named so
        self._paths = WeakMap()  # module named in a caller's subtree -> {id(submodule): its path}
        self.root_name = None
        self.compiled_seen = False  # a torch.compile'd module ran (eagerly, under the tracer)
        if model is not None:
            self._adopt(model)

    def name_of(self, module, caller=None):
        """The name of `module` called inside module `caller` (a name; None or '' outside every module)."""
        name = self._names.get(module)
        if name is not None and (
            not caller or not self._external_roots or self.in_model(name) or name.startswith(caller + ".")
        ):
            return name
        return self._name_new(module, caller, name)

    def entered(self, name):
        """Module `name`'s forward begins: the modules it calls are counted afresh."""
        if self._calls:
            self._calls.pop(name, None)

    def new_step(self):
        self._given_in_step.clear()
        self._walked = False

    def owner(self, name):
        """The module a name given in a caller's subtree hangs from (the name itself for any other)."""
        callers = self._callers
        while name in callers:
            name = callers[name]
        return name

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

    def _name_new(self, module, caller, name):
        original = compiled_original(module)
        if original is not None:  # a wrapper is named as what it wraps
            self.compiled_seen = True
            if caller:
                return self.name_of(original, caller)
            name = self._names[module] = self.name_of(original)
            return name
        model = self._model()
        if model is None and self.root_name is None:  # no model=: the first module that runs is the model
            self._adopt(module)
            return self.root_name
        if name is None and module not in self._outside:
            if model is not None and not (caller and self._walked):
                self._name_children(model, "")  # a submodule added to the model after tracing began
                self._walked = True
            name = self._names.get(module)
            if name is not None and self.in_model(name):
                return name
            self._outside[module] = True
            if self._on_external is not None:
                self._on_external(module)
        if caller:
            return self._name_in(module, caller)
        if name is None:
            name = self._name_root(module)
        return name

    def _name_in(self, module, caller):
        """`module`'s name in the subtree of `caller`, which called it: its path below the module of that
        name it is a submodule of, else its class, numbered by its order among its class's in this call."""
        call = self._calls.get(caller)
        if call is None:
            call = self._calls[caller] = (WeakMap(), {})
        names, counts = call
        name = names.get(module)
        if name is not None:
            return name
        ref = self._holders_in.get(caller)
        if ref is not None and ref() is module:  # a compiled wrapper's module, called inside it: named as it
            return caller
        path = self._path_below(caller, module)
        if path is None:
            cls = type(module).__name__
            k = counts.get(cls, 1 if cls == caller == self.root_name else 0)  # never the root's own name
            counts[cls] = k + 1
            path = cls if k == 0 else f"{cls}{CALL_MARK}{k}"
        name = f"{caller}.{path}" if caller != self.root_name else path
        names[module] = name
        self._callers[name] = caller
        self._holders_in[name] = weakref.ref(module)
        return name

    def _path_below(self, caller, module):
        """`module`'s path below the module named `caller` in a caller's subtree, when it is its submodule."""
        ref = self._holders_in.get(caller)
        holder = ref() if ref is not None else None
        if holder is None:
            return None
        paths = self._paths.get(holder)
        if paths is None:
            paths = {id(child): strip_compiled(p) for p, child in holder.named_modules(remove_duplicate=False) if p}
            self._paths[holder] = paths
        return paths.get(id(module))

    def _name_root(self, module):
        """An external root's name: `<ClassName>#<k>`, k the smallest whose module is gone and not given in this step."""
        cls = type(module).__name__
        k = 1
        while True:
            name = f"{cls}{EXTERNAL_MARK}{k}"
            holder = self._root_holders.get(name)
            if name not in self._given_in_step and (holder is None or holder() is None):
                break
            k += 1
        self._names[module] = name
        self._root_holders[name] = weakref.ref(module)
        self._given_in_step.add(name)
        self._external_roots.add(name)
        self._name_children(module, name + ".")
        return name
