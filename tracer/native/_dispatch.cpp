// The dispatch hook in C++: what `_TraceMode.__torch_dispatch__` and `Tracer._record` do for the
// common op, with no Python frame (tracer.recording.dispatch, tracer.recording.row).
//
// `Dispatch(tracer, hook, spec)` is made once per trace (tracer.recording.start `_start`); `dispatch_for(mode)`
// gives the builtin that becomes the mode's `__torch_dispatch__`: bound to the mode, as torch requires,
// it finds the Dispatch in the mode's `_hot`. For each op it
//   - looks the op up in its own table (made from `mode._info(func)`: the same `_OpInfo` the Python
//     hook uses) and runs it through `func._op` (OpOverload.__call__'s one line) with the wall clock read
//     around it, or the tracer's timer (`timer.start()`, `timer.stop(start)`) when it is not the plain
//     wall clock (CUDA events, "sync", "off");
//   - reads its tensors (collect_core, tracer/native/_collector.cpp), its FLOPs (a formula: `rule.count`
//     called in Python), its phase, module and recompute flag (the common cases of Attribution.where
//     read from the Attribution's own attributes, the others by calling `where`), its module and device
//     ids and the storages freed, and appends the row to the tracer's row buffers;
//   - hands everything else to Python, whole: ops without an `_OpInfo` of their own (higher-order
//     operators), collectives and tensor subclasses go to the Python hook before the op runs (`hook`:
//     `_TraceMode.__torch_dispatch__`); ops whose FLOPs are a FlopCount (grouped matmuls, packed
//     attention) and ops with a sparse, nested or symbolic tensor to `Tracer._record` once it ran.
// Both paths write the same rows (tests/tracer/native/test_collector.py compares the traces column by column).
//
// The state read here stays the Python objects' (the tracer's, the StorageTable's, the Attribution's
// attributes, read through their instance dicts), so the Python code that runs between ops (module and
// optimizer hooks, the flush) sees what it always saw. A bookkeeping failure is the same as in Python:
// an Exception becomes `Tracer._record_failed(op, exc)` and the op's result is returned; anything else
// (a KeyboardInterrupt) drops the half-made row and propagates.

#include "_dispatch.h"

#include <c10/core/GradMode.h>
#include <c10/core/InferenceMode.h>
#include <torch/csrc/autograd/python_variable.h>

#include <time.h>

#include <string>
#include <unordered_map>

namespace optrace {

#define OPTRACE_DEFINE(n) PyObject* s_##n = nullptr;
OPTRACE_NAMES(OPTRACE_DEFINE)
#undef OPTRACE_DEFINE
PyObject* s_empty = nullptr;

namespace {

// How an op goes through the hook.
enum Route { PASS, FAST, RECORD_IN_PYTHON, PYTHON_HOOK };

struct Op {
  PyObject* func = nullptr;  // the OpOverload, kept: its address is the table's key
  PyObject* call = nullptr;  // func._op, or func when its class has a __call__ of its own
  PyObject* info = nullptr;  // the _OpInfo, or nullptr (passed through unrecorded)
  PyObject* name = nullptr;
  PyObject* count = nullptr;  // rule.count, for a formula
  PyObject* causal = nullptr;  // rule.causal, or nullptr
  Route route = PASS;
  Native native = IN_PYTHON;
  int64_t name_id = 0, kind_id = 0, inplace = 0, basis = 0;
  struct WrittenArg {
    Py_ssize_t position;
    PyObject* name;
    bool is_out;
  };
  std::vector<WrittenArg> written;
};

struct Dispatch {
  PyObject_HEAD
  PyObject* tracer;  // the Tracer, its instance dict, and the objects the hook reads
  PyObject* tracer_dict;
  PyObject* hook;  // _TraceMode.__torch_dispatch__: every op the fast path does not take
  PyObject* storages;
  PyObject* storages_dict;
  PyObject* attr;
  PyObject* attr_dict;
  PyObject* steps_dict;
  PyObject* ctx;  // tracer._collect_ctx (tracer/native/_collector.h)
  PyObject* op_info_type;  // tracer.recording.dispatch._OpInfo
  PyObject* plain_types;  // (Tensor, Parameter): `types` that are no subclass
  PyObject* op_call;  // OpOverload.__call__
  PyObject* rows;  // the RowBuffer whose arrays are below (it changes at each flush)
  PyObject* ints;
  PyObject* side_bufs[6];  // RowBuffer.sides' arrays: in_tensors, in_sizes, in_strides, out_tensors, ...
  PyObject* freed_buf;
  PyObject* groups_buf;  // RowBuffer.groups: appended in Python only, counted in the flush (after_row)
  PyObject* timer;  // the timer whose flags are below (it changes at the first device)
  bool timer_inline, timer_binds;
  bool closed;
  int busy;  // ops inside `run` (another thread's, while this one runs Python): close waits for them to clear
  bool clear_when_idle;
  int64_t recorded;  // rows this hook wrote itself
  int recording;  // rows being made (`record`): a SIGTERM then is held (tracer.recording.signals) until they are whole
  bool held;  // a SIGTERM came while a row was made: Tracer._signal_due once none is
  Constants k;
  std::unordered_map<PyObject*, Op>* ops;
};

PyTypeObject DispatchType = {PyVarObject_HEAD_INIT(nullptr, 0)};

// ------------------------------------------------------------------------------------- small helpers
int64_t now_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);  // time.perf_counter_ns's clock on Linux (checked at construction)
  return static_cast<int64_t>(ts.tv_sec) * 1000000000LL + ts.tv_nsec;
}

PyObject* list_of(const std::vector<PyObject*>& items) {
  PyObject* list = PyList_New(static_cast<Py_ssize_t>(items.size()));
  if (list == nullptr) {
    return nullptr;
  }
  for (size_t i = 0; i < items.size(); i++) {
    PyList_SET_ITEM(list, i, Py_NewRef(items[i]));
  }
  return list;
}

int64_t int_attr(PyObject* o, PyObject* name, int* failed) {
  PyObject* v = PyObject_GetAttr(o, name);
  if (v == nullptr) {
    *failed = 1;
    return 0;
  }
  int64_t n = PyLong_AsLongLong(v);
  Py_DECREF(v);
  if (n == -1 && PyErr_Occurred()) {
    *failed = 1;
  }
  return n;
}

// -------------------------------------------------------------------------------------------- the op table
void clear_op(Op& op) {
  Py_CLEAR(op.func);
  Py_CLEAR(op.call);
  Py_CLEAR(op.info);
  Py_CLEAR(op.name);
  Py_CLEAR(op.count);
  Py_CLEAR(op.causal);
  for (auto& w : op.written) {
    Py_CLEAR(w.name);
  }
  op.written.clear();
}

// Fills `op` from the _OpInfo the mode gives for `func` (tracer.recording.dispatch `_TraceMode._info`).
int describe_op(Dispatch* self, PyObject* mode, PyObject* func, Op& op) {
  op.func = Py_NewRef(func);
  PyObject* info = PyObject_CallMethodOneArg(mode, s__info, func);
  if (info == nullptr) {
    return -1;
  }
  bool passthrough = info == Py_None;  // metadata queries, profiler markers: run unrecorded
  if (passthrough) {
    Py_DECREF(info);
  } else if (Py_TYPE(info) != reinterpret_cast<PyTypeObject*>(self->op_info_type)) {  // a higher-order operator
    op.info = info;
    op.route = PYTHON_HOOK;
    op.call = Py_NewRef(func);
    return 0;
  } else {
    op.info = info;
  }
  PyObject* cls_call = PyObject_GetAttr(reinterpret_cast<PyObject*>(Py_TYPE(func)), s___call__);
  if (cls_call == nullptr) {
    return -1;
  }
  bool plain_call = cls_call == self->op_call;
  Py_DECREF(cls_call);
  op.call = plain_call ? PyObject_GetAttr(func, s__op) : Py_NewRef(func);
  if (op.call == nullptr) {
    return -1;
  }
  if (passthrough) {
    op.route = PASS;
    return 0;
  }
  PyObject* collective = PyObject_GetAttr(info, s_collective);
  if (collective == nullptr) {
    return -1;
  }
  bool is_collective = collective != Py_None;
  Py_DECREF(collective);
  if (is_collective) {  // its tensors and writes come from the c10d table (tracer.recording.collectives)
    op.route = PYTHON_HOOK;
    return 0;
  }
  int failed = 0;
  op.name_id = int_attr(info, s_name_id, &failed);
  op.kind_id = int_attr(info, s_kind_id, &failed);
  op.inplace = int_attr(info, s_inplace, &failed);
  op.basis = int_attr(info, s_basis, &failed);
  if (failed) {
    return -1;
  }
  op.name = PyObject_GetAttr(info, s_name);
  PyObject* rule = PyObject_GetAttr(info, s_rule);
  if (op.name == nullptr || rule == nullptr) {
    Py_XDECREF(rule);
    return -1;
  }
  op.count = PyObject_GetAttr(rule, s_count);
  PyObject* causal = op.count == nullptr ? nullptr : PyObject_GetAttr(rule, s_causal);
  Py_DECREF(rule);
  if (causal == nullptr) {
    return -1;
  }
  if (causal == Py_None) {
    Py_DECREF(causal);
  } else {
    op.causal = causal;
  }
  PyObject* native = PyObject_GetAttr(info, s_native);
  if (native == nullptr) {
    return -1;
  }
  if (native != Py_None) {
    const char* name = PyUnicode_AsUTF8(native);
    if (name == nullptr) {
      Py_DECREF(native);
      return -1;
    }
    op.native = native_named(name);
  }
  Py_DECREF(native);
  PyObject* positions = PyObject_GetAttr(info, s_written_positions);
  PyObject* names = positions == nullptr ? nullptr : PyObject_GetAttr(info, s_written_names);
  PyObject* out_only = names == nullptr ? nullptr : PyObject_GetAttr(info, s_out_only);
  int rc = 0;
  if (out_only == nullptr || !PyTuple_Check(positions) || !PyTuple_Check(names) || !PyTuple_Check(out_only) ||
      PyTuple_GET_SIZE(names) != PyTuple_GET_SIZE(positions) || PyTuple_GET_SIZE(out_only) != PyTuple_GET_SIZE(positions)) {
    if (!PyErr_Occurred()) {
      PyErr_SetString(PyExc_TypeError, "optrace dispatch: written_positions, written_names and out_only must be tuples");
    }
    rc = -1;
  } else {
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(positions); i++) {
      Py_ssize_t position = PyLong_AsSsize_t(PyTuple_GET_ITEM(positions, i));
      int is_out = PyObject_IsTrue(PyTuple_GET_ITEM(out_only, i));
      if ((position == -1 && PyErr_Occurred()) || is_out < 0) {
        rc = -1;
        break;
      }
      op.written.push_back({position, Py_NewRef(PyTuple_GET_ITEM(names, i)), is_out != 0});
    }
  }
  Py_XDECREF(positions);
  Py_XDECREF(names);
  Py_XDECREF(out_only);
  if (rc < 0) {
    return -1;
  }
  // a FlopCount (FLOPs, bound, group sizes) is read by Tracer._record
  op.route = op.basis == self->k.basis_detailed ? RECORD_IN_PYTHON : FAST;
  return 0;
}

Op* find_op(Dispatch* self, PyObject* mode, PyObject* func) {
  auto found = self->ops->find(func);
  if (found != self->ops->end()) {
    return &found->second;
  }
  Op op;
  if (describe_op(self, mode, func, op) < 0) {
    clear_op(op);
    return nullptr;
  }
  return &self->ops->emplace(func, op).first->second;
}

// The tensors the op writes into: `_OpInfo.written` (tracer.recording.dispatch) in C++.
void written_args(const Op& op, PyObject* args, PyObject* kwargs, Written& found) {
  for (const auto& w : op.written) {
    PyObject* value = nullptr;
    if (PyTuple_Check(args) && w.position < PyTuple_GET_SIZE(args)) {
      value = PyTuple_GET_ITEM(args, w.position);
    } else if (kwargs != nullptr && PyDict_Check(kwargs)) {
      value = PyDict_GetItem(kwargs, w.name);  // borrowed; a failed lookup is "absent", as dict.get
    }
    if (value == nullptr) {
      continue;
    }
    if (THPVariable_Check(value)) {
      found.emplace_back(value, w.is_out);
    } else if (PyList_Check(value) || PyTuple_Check(value)) {
      for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(value); i++) {
        PyObject* v = PySequence_Fast_GET_ITEM(value, i);
        if (THPVariable_Check(v)) {
          found.emplace_back(v, w.is_out);
        }
      }
    }
  }
}

// ------------------------------------------------------------------------------------------------ a row
// The tracer's attribute `name` (borrowed), or nullptr with an error set.
PyObject* tracer_item(Dispatch* self, PyObject* name) {
  PyObject* value = item(self->tracer_dict, name);
  if (value == nullptr && !PyErr_Occurred()) {
    PyErr_Format(PyExc_AttributeError, "optrace dispatch: the tracer has no %U", name);
  }
  return value;
}

// The row buffer's arrays, read again when the tracer made a new RowBuffer (at each flush).
int bind_rows(Dispatch* self, PyObject** rows_out) {
  PyObject* rows = tracer_item(self, s__rows);
  if (rows == nullptr) {
    return -1;
  }
  if (rows != self->rows) {
    PyObject* d = instance_dict(rows);
    if (d == nullptr) {
      return -1;
    }
    PyObject *ints = item(d, s_ints), *sides = item(d, s_sides), *freed = item(d, s_freed);
    PyObject* groups = item(d, s_groups);
    PyObject* buffers[6];
    if (ints == nullptr || sides == nullptr || freed == nullptr || groups == nullptr || side_buffers(sides, buffers) < 0) {
      Py_DECREF(d);
      if (!PyErr_Occurred()) {
        PyErr_SetString(PyExc_AttributeError, "optrace dispatch: a RowBuffer without its arrays");
      }
      return -1;
    }
    Py_XSETREF(self->ints, Py_NewRef(ints));
    for (int i = 0; i < 6; i++) {
      Py_XSETREF(self->side_bufs[i], Py_NewRef(buffers[i]));
    }
    Py_XSETREF(self->freed_buf, Py_NewRef(freed));
    Py_XSETREF(self->groups_buf, Py_NewRef(groups));
    Py_XSETREF(self->rows, Py_NewRef(rows));
    Py_DECREF(d);
  }
  *rows_out = rows;
  return 0;
}

// The timer's flags, read again when the tracer made a new timer (at its first device).
int bind_timer(Dispatch* self, PyObject** timer_out) {
  PyObject* timer = tracer_item(self, s__timer);
  if (timer == nullptr) {
    return -1;
  }
  if (timer != self->timer) {
    PyObject* inl = PyObject_GetAttr(timer, s_inline_);
    PyObject* binds = inl == nullptr ? nullptr : PyObject_GetAttr(timer, s_binds);
    int inline_on = binds == nullptr ? -1 : PyObject_IsTrue(inl);
    int binds_on = inline_on < 0 ? -1 : PyObject_IsTrue(binds);
    Py_XDECREF(inl);
    Py_XDECREF(binds);
    if (binds_on < 0) {
      return -1;
    }
    Py_XSETREF(self->timer, Py_NewRef(timer));
    self->timer_inline = inline_on;
    self->timer_binds = binds_on;
  }
  *timer_out = timer;
  return 0;
}

PyObject* call_op(PyObject* call, PyObject* args, PyObject* kwargs) {
  if (kwargs != nullptr && (kwargs == Py_None || (PyDict_Check(kwargs) && PyDict_GET_SIZE(kwargs) == 0))) {
    kwargs = nullptr;
  }
  return PyObject_Call(call, args, kwargs);
}

// The keyword arguments as the Python hook hands them on: a dict, {} for none.
PyObject* kwargs_dict(PyObject* kwargs) {
  return kwargs != nullptr && PyDict_Check(kwargs) ? Py_NewRef(kwargs) : PyDict_New();
}

// Tracer._record(info, args, kwargs, out, start, duration): the Python path for this op's row.
int record_in_python(Dispatch* self, const Op& op, PyObject* args, PyObject* kwargs, PyObject* out, int64_t start,
                     int64_t duration) {
  PyObject* kw = kwargs_dict(kwargs);
  if (kw == nullptr) {
    return -1;
  }
  PyObject* done = PyObject_CallMethod(self->tracer, "_record", "OOOOLL", op.info, args, kw, out,
                                       static_cast<long long>(start), static_cast<long long>(duration));
  Py_DECREF(kw);
  if (done == nullptr) {
    return -1;
  }
  Py_DECREF(done);
  return 0;
}

// A new reference, released when this goes out of scope.
struct Owned {
  PyObject* p = nullptr;
  Owned() = default;
  explicit Owned(PyObject* o) : p(o) {}
  Owned(const Owned&) = delete;
  Owned& operator=(const Owned&) = delete;
  ~Owned() {
    Py_XDECREF(p);
  }
};

// The keyword arguments as a dict, made at the first Python call that takes them (as the Python hook hands
// them on: {} for none).
struct Kwargs {
  PyObject* given;
  Owned dict;
  explicit Kwargs(PyObject* kwargs) : given(kwargs) {}
  PyObject* get() {
    if (dict.p == nullptr) {
      dict.p = kwargs_dict(given);
    }
    return dict.p;
  }
};

// The op's FLOPs from its rule (tracer.recording.row `_record` does the same): per output element (counted at the
// write), a count computed here (native_flops), or the rule's count called in Python, stored as INT64_MAX and
// flagged a bound past int64.
int count_flops(const Constants& k, const Op& op, PyObject* args, Kwargs& kw, PyObject* out, int64_t* flops,
                int64_t* bound) {
  *flops = *bound = 0;
  if (op.basis == k.basis_per_element) {
    *flops = k.per_output_element;
    return 0;
  }
  if (op.basis != k.basis_formula || native_flops(op.native, args, kw.given, flops)) {
    return 0;
  }
  PyObject* kwargs = kw.get();
  Owned n(kwargs == nullptr ? nullptr : PyObject_CallFunctionObjArgs(op.count, args, kwargs, out, nullptr));
  if (n.p == nullptr) {
    return -1;
  }
  int overflow = 0;
  if (PyLong_Check(n.p)) {
    *flops = PyLong_AsLongLongAndOverflow(n.p, &overflow);
  } else {  // not an int (a float): compared with INT64_MAX first, as tracer.recording.row does, then packed
    Owned most(PyLong_FromLongLong(k.int64_max));
    int above = most.p == nullptr ? -1 : PyObject_RichCompareBool(n.p, most.p, Py_GT);
    if (above < 0) {
      return -1;
    }
    overflow = above;
    *flops = above ? 0 : PyLong_AsLongLong(n.p);
  }
  if (overflow > 0) {  // past int64: stored as the largest int64, flagged a bound
    *flops = k.int64_max;
    *bound = 1;
  } else if (overflow < 0 || (*flops == -1 && PyErr_Occurred())) {
    if (!PyErr_Occurred()) {
      PyErr_SetString(PyExc_OverflowError, "optrace dispatch: a FLOP count below -2**63");
    }
    return -1;
  }
  return 0;
}

// Whether an attention kernel's mask was causal: rule.causal(args, kwargs), or CAUSAL_NONE for other ops.
int causal_of(const Constants& k, const Op& op, PyObject* args, Kwargs& kw, int64_t* causal) {
  *causal = k.causal_none;
  if (op.causal == nullptr) {
    return 0;
  }
  PyObject* kwargs = kw.get();
  Owned is_causal(kwargs == nullptr ? nullptr : PyObject_CallFunctionObjArgs(op.causal, args, kwargs, nullptr));
  int on = is_causal.p == nullptr ? -1 : PyObject_IsTrue(is_causal.p);
  *causal = on;
  return on < 0 ? -1 : 0;
}

// (phase, module, recompute): fast_where's common cases, else Attribution.where called in Python.
int where_of(Dispatch* self, const Op& op, const Collected& c, PyObject* args, Kwargs& kw, int64_t* phase,
             Owned& module, int64_t* recompute) {
  int fast = fast_where(self->attr_dict, self->k, phase, &module.p, recompute);
  if (fast != 0) {
    return fast < 0 ? -1 : 0;
  }
  PyObject* kwargs = kw.get();
  Owned ins(kwargs == nullptr ? nullptr : list_of(c.ins));
  Owned outs(ins.p == nullptr ? nullptr : list_of(c.outs));
  Owned where(outs.p == nullptr ? nullptr : PyObject_CallMethodObjArgs(self->attr, s_where, ins.p, outs.p, op.info,
                                                                      args, kwargs, Py_False, nullptr));
  if (where.p == nullptr) {
    return -1;
  }
  if (!PyTuple_Check(where.p) || PyTuple_GET_SIZE(where.p) != 3) {
    PyErr_SetString(PyExc_TypeError, "optrace dispatch: where() must return (phase, module, recompute)");
    return -1;
  }
  *phase = PyLong_AsLongLong(PyTuple_GET_ITEM(where.p, 0));
  module.p = Py_NewRef(PyTuple_GET_ITEM(where.p, 1));
  *recompute = PyLong_AsLongLong(PyTuple_GET_ITEM(where.p, 2));
  return PyErr_Occurred() ? -1 : 0;
}

// The id under `key` in the tracer's dict `table` (_module_ids, _device_keys), or what the tracer's method
// `make(key, extra...)` gives for one it has not seen (it notes it there).
int id_of(Dispatch* self, PyObject* table, PyObject* key, PyObject* make, PyObject* first, int64_t* id) {
  PyObject* ids = item(self->tracer_dict, table);
  PyObject* found = ids == nullptr ? nullptr : item(ids, key);
  if (found != nullptr) {
    *id = PyLong_AsLongLong(found);
    return (*id == -1 && PyErr_Occurred()) ? -1 : 0;
  }
  if (PyErr_Occurred()) {
    return -1;
  }
  Owned made(first == nullptr ? PyObject_CallMethodOneArg(self->tracer, make, key)
                              : PyObject_CallMethodObjArgs(self->tracer, make, first, key, nullptr));
  *id = made.p == nullptr ? -1 : PyLong_AsLongLong(made.p);
  return (*id == -1 && PyErr_Occurred()) ? -1 : 0;
}

// Appends the row: its tensors' sides, its frees and its integers; all or nothing (a failure cuts every buffer
// back).
int append_row(Dispatch* self, const Collected& c, const std::vector<int64_t>& freed, const int64_t* row, Py_ssize_t width) {
  Py_ssize_t lengths[6];
  for (int i = 0; i < 6; i++) {
    lengths[i] = PySequence_Size(self->side_bufs[i]);
  }
  Py_ssize_t freed_length = PySequence_Size(self->freed_buf), ints_length = PySequence_Size(self->ints);
  if (append_sides(self->side_bufs, c) == 0 &&
      append_int64(self->freed_buf, freed.data(), static_cast<Py_ssize_t>(freed.size())) == 0 &&
      append_int64(self->ints, row, width) == 0) {
    return 0;
  }
  PyObject *type, *value, *tb;  // keep the first error while the half-made row is dropped
  PyErr_Fetch(&type, &value, &tb);
  for (int i = 0; i < 6; i++) {
    truncate(self->side_bufs[i], lengths[i]);
  }
  truncate(self->freed_buf, freed_length);
  truncate(self->ints, ints_length);
  PyErr_Restore(type, value, tb);
  return -1;
}

// After a row: the timer binds it (CUDA events, no times: the row's time is the timer's, tracer.recording.timing), and
// a full buffer is flushed as a part.
int after_row(Dispatch* self, PyObject* rows) {
  PyObject* timer;
  if (bind_timer(self, &timer) < 0) {
    return -1;
  }
  if (self->timer_binds) {
    Owned done(PyObject_CallMethodOneArg(timer, s_bind, rows));
    if (done.p == nullptr) {
      return -1;
    }
  }
  int64_t flush_at, flush_values;  // read at each row, as the Python path reads them
  if (item_int(self->tracer_dict, s__flush_at, &flush_at) < 0 ||
      item_int(self->tracer_dict, s__flush_values, &flush_values) < 0) {
    return -1;
  }
  Py_ssize_t rows_length = PySequence_Size(self->ints);
  Py_ssize_t values = rows_length + PySequence_Size(self->freed_buf) + PySequence_Size(self->groups_buf);
  for (PyObject* buffer : self->side_bufs) {  // RowBuffer.values: the integers of all its arrays
    values += PySequence_Size(buffer);
  }
  if (PyErr_Occurred()) {  // a length failed (never, for an array)
    return -1;
  }
  if (rows_length >= flush_at || values >= flush_values) {
    Owned done(PyObject_CallMethodNoArgs(self->tracer, s__flush));
    return done.p == nullptr ? -1 : 0;
  }
  return 0;
}

// Autograd's mode on this thread, as tracer.schema.GradMode: what Tracer._record reads with torch.is_grad_enabled() and
// torch.is_inference_mode_enabled() (two thread-local reads).
inline int64_t grad_mode(const Constants& k) {
  return c10::GradMode::is_enabled() ? k.grad : c10::InferenceMode::is_enabled() ? k.inference_mode : k.no_grad;
}

// The row of an op the fast path takes, what Tracer._record does (tracer.recording.row); -1 with an error set
// (*whole: the row was appended before it).
int record(Dispatch* self, const Op& op, PyObject* args, PyObject* kwargs, PyObject* out, int64_t start,
           int64_t duration, bool* whole) {
  const Constants& k = self->k;
  if (collect_frees(self->storages_dict) < 0) {  // frees noted since the last op (tracer.recording.storage)
    return -1;
  }
  if (op.route == RECORD_IN_PYTHON) {
    return record_in_python(self, op, args, kwargs, out, start, duration);
  }
  PyObject* const* ctx = &PyTuple_GET_ITEM(self->ctx, 0);
  // this thread's buffers, kept between ops (no op's record runs inside another's on one thread: the mode is off
  // the stack while its hook runs)
  thread_local Written written;
  thread_local Collected c;
  thread_local std::vector<int64_t> freed_ids;
  written.clear();
  c.clear();
  if (!op.written.empty()) {
    written_args(op, args, kwargs, written);
  }
  int collected = collect_core(ctx, args, kwargs, out, op.written.empty() ? nullptr : &written, c);
  if (collected <= 0) {  // 0: a sparse, nested or symbolic tensor, which the Python path reads
    return collected < 0 ? -1 : record_in_python(self, op, args, kwargs, out, start, duration);
  }
  int failed = 0;
  int64_t allocated = registered_bytes(ctx, &failed) - c.registered;
  Kwargs kw(kwargs);
  int64_t flops, bound, causal, phase = 0, recompute = 0, module_id, device_id, step, live_bytes;
  Owned module;
  if (failed || count_flops(k, op, args, kw, out, &flops, &bound) < 0 || causal_of(k, op, args, kw, &causal) < 0 ||
      where_of(self, op, c, args, kw, &phase, module, &recompute) < 0 ||
      id_of(self, s__module_ids, module.p, s__new_module, nullptr, &module_id) < 0) {
    return -1;
  }
  // the row's device is its first tensor's
  Owned key(PyLong_FromLongLong(c.device_key));
  PyObject* first = !c.ins.empty() ? c.ins[0] : !c.outs.empty() ? c.outs[0] : Py_None;
  if (key.p == nullptr || id_of(self, s__device_keys, key.p, s__device_of, first, &device_id) < 0 ||
      item_int(self->steps_dict, s_step, &step) < 0) {
    return -1;
  }
  // the storages freed since the previous row
  PyObject* freed = item(self->storages_dict, s_freed);
  if (freed == nullptr || !PyList_Check(freed)) {
    if (!PyErr_Occurred()) {
      PyErr_SetString(PyExc_TypeError, "optrace dispatch: StorageTable.freed is not a list");
    }
    return -1;
  }
  Py_ssize_t n_freed = PyList_GET_SIZE(freed);
  freed_ids.resize(n_freed);
  for (Py_ssize_t i = 0; i < n_freed; i++) {
    freed_ids[i] = PyLong_AsLongLong(PyList_GET_ITEM(freed, i));
    if (freed_ids[i] == -1 && PyErr_Occurred()) {
      return -1;
    }
  }
  if (item_int(self->storages_dict, s_live_bytes, &live_bytes) < 0) {
    return -1;
  }
  // the row: tracer.store.writer ROW_FIELDS, in order (checked against them in Dispatch's constructor)
  const int64_t row[] = {
      step, op.name_id, phase, module_id, device_id, op.kind_id, op.inplace, causal,
      flops, allocated, live_bytes, c.inplace_bytes, c.out_bytes, duration,
      static_cast<int64_t>(c.ins.size()), static_cast<int64_t>(c.outs.size()), n_freed,
      recompute, start, duration, 0 /* layout: strided */, k.no_value, k.no_value, 0 /* process group */,
      bound, k.no_value, grad_mode(k),
  };
  PyObject* rows;
  if (bind_rows(self, &rows) < 0 || append_row(self, c, freed_ids, row, sizeof(row) / sizeof(row[0])) < 0) {
    return -1;
  }
  *whole = true;  // a Ctrl-C from here on leaves the row as it is
  self->recorded++;
  if (n_freed && PyList_SetSlice(freed, 0, n_freed, nullptr) < 0) {
    return -1;
  }
  return after_row(self, rows);
}

// --------------------------------------------------------------------------------------------- the hook
// Whether every class in `types` is Tensor or Parameter (a Tensor method's detach names them): no subclass.
bool plain_types(Dispatch* self, PyObject* types) {
  if (types == nullptr || types == Py_None) {
    return true;
  }
  if (!PyTuple_Check(types) && !PyList_Check(types)) {
    return false;
  }
  for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(types); i++) {
    PyObject* t = PySequence_Fast_GET_ITEM(types, i);
    if (t != PyTuple_GET_ITEM(self->plain_types, 0) && t != PyTuple_GET_ITEM(self->plain_types, 1)) {
      return false;
    }
  }
  return true;
}

PyObject* python_hook(PyObject* hook, PyObject* mode, PyObject* func, PyObject* types, PyObject* args,
                      PyObject* kwargs) {
  PyObject* call_args[] = {mode, func, types, args, kwargs != nullptr ? kwargs : Py_None};
  return PyObject_Vectorcall(hook, call_args, 5, nullptr);
}

int Dispatch_clear(PyObject* o);

// `result` once a SIGTERM held while a row was made (`held`) has been handed to Tracer._signal_due: nullptr with
// its error when that raised (the program's own handler's SystemExit).
PyObject* signal_due(Dispatch* self, PyObject* result) {
  if (!self->held || self->recording) {
    return result;
  }
  self->held = false;
  PyObject* done = PyObject_CallMethodNoArgs(self->tracer, s__signal_due);
  if (done == nullptr) {
    Py_DECREF(result);
    return nullptr;
  }
  Py_DECREF(done);
  return result;
}

// The op through the hook's state `self`: its result, or nullptr with an error set.
PyObject* run(Dispatch* self, PyObject* mode, PyObject* func, PyObject* types, PyObject* args, PyObject* kwargs) {
  if (self->closed) {  // the trace is over: the mode's class decides
    PyObject* hook = PyObject_GetAttrString(reinterpret_cast<PyObject*>(Py_TYPE(mode)), "__torch_dispatch__");
    if (hook == nullptr) {
      return nullptr;
    }
    PyObject* result = python_hook(hook, mode, func, types, args, kwargs);
    Py_DECREF(hook);
    return result;
  }
  Op* op = find_op(self, mode, func);
  if (op == nullptr) {
    return nullptr;
  }
  if (op->route == PYTHON_HOOK || (op->route != PASS && !plain_types(self, types))) {
    return python_hook(self->hook, mode, func, types, args, kwargs);
  }
  if (op->route == PASS) {
    return call_op(op->call, args, kwargs);
  }
  PyObject* timer;
  if (bind_timer(self, &timer) < 0) {
    return nullptr;
  }
  int64_t start, duration = 0;
  PyObject* result;
  if (self->timer_inline) {  // a plain wall clock (tracer.recording.timing WallTimer): no timer call around the op
    start = now_ns();
    result = call_op(op->call, args, kwargs);
    duration = now_ns() - start;
  } else {
    Py_INCREF(timer);
    PyObject* began = PyObject_CallMethodNoArgs(timer, s_start);
    start = began == nullptr ? -1 : PyLong_AsLongLong(began);
    Py_XDECREF(began);
    if (start == -1 && PyErr_Occurred()) {
      Py_DECREF(timer);
      return nullptr;
    }
    result = call_op(op->call, args, kwargs);
    if (result != nullptr) {
      PyObject* stopped = PyObject_CallMethod(timer, "stop", "L", static_cast<long long>(start));
      duration = stopped == nullptr ? -1 : PyLong_AsLongLong(stopped);
      Py_XDECREF(stopped);
      if (duration == -1 && PyErr_Occurred()) {
        Py_CLEAR(result);
      }
    }
    Py_DECREF(timer);
  }
  if (result == nullptr) {  // the op raised: its exception is the program's, as untraced
    return nullptr;
  }
  bool whole = false;
  self->recording++;
  int failed = record(self, *op, args, kwargs, result, start, duration, &whole);
  self->recording--;
  if (failed == 0) {
    return signal_due(self, result);
  }
  if (!PyErr_ExceptionMatches(PyExc_Exception)) {  // a KeyboardInterrupt: the program gets it (record dropped a half-made row)
    Py_DECREF(result);
    return nullptr;
  }
  PyObject *type, *value, *tb;  // never break the traced program over a bookkeeping error
  PyErr_Fetch(&type, &value, &tb);
  PyErr_NormalizeException(&type, &value, &tb);
  PyObject* told = PyObject_CallMethodObjArgs(self->tracer, s__record_failed, op->name, value, nullptr);
  Py_XDECREF(type);
  Py_XDECREF(value);
  Py_XDECREF(tb);
  if (told == nullptr) {
    Py_DECREF(result);
    return nullptr;
  }
  Py_DECREF(told);
  return signal_due(self, result);
}

// mode.__torch_dispatch__(func, types, args=(), kwargs=None), bound to the mode.
PyObject* torch_dispatch(PyObject* mode, PyObject* const* argv, size_t nargsf, PyObject* kwnames) {
  Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
  PyObject *func = nargs > 0 ? argv[0] : nullptr, *types = nargs > 1 ? argv[1] : nullptr;
  PyObject *args = nargs > 2 ? argv[2] : nullptr, *kwargs = nargs > 3 ? argv[3] : nullptr;
  if (kwnames != nullptr) {
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(kwnames); i++) {
      const char* name = PyUnicode_AsUTF8(PyTuple_GET_ITEM(kwnames, i));
      if (name == nullptr) {
        return nullptr;
      }
      PyObject* value = argv[nargs + i];
      if (std::string(name) == "args") {
        args = value;
      } else if (std::string(name) == "kwargs") {
        kwargs = value;
      } else if (std::string(name) == "types") {
        types = value;
      } else {
        PyErr_Format(PyExc_TypeError, "__torch_dispatch__() got an unexpected keyword argument '%s'", name);
        return nullptr;
      }
    }
  }
  if (func == nullptr || types == nullptr) {
    PyErr_SetString(PyExc_TypeError, "__torch_dispatch__(func, types, args=(), kwargs=None) takes func and types");
    return nullptr;
  }
  PyObject* mode_dict = instance_dict(mode);
  PyObject* found = mode_dict == nullptr ? nullptr : item(mode_dict, s__hot);
  Py_XINCREF(found);  // alive to the end, whatever the op or the tracer's Python does meanwhile
  Py_XDECREF(mode_dict);
  if (found == nullptr || Py_TYPE(found) != &DispatchType) {
    if (!PyErr_Occurred()) {
      PyErr_SetString(PyExc_RuntimeError, "optrace dispatch: the mode has no Dispatch in _hot");
    }
    Py_XDECREF(found);
    return nullptr;
  }
  PyObject* empty = args == nullptr ? PyTuple_New(0) : nullptr;
  PyObject* result = nullptr;
  if (args != nullptr || empty != nullptr) {
    auto* self = reinterpret_cast<Dispatch*>(found);
    self->busy++;
    result = run(self, mode, func, types, args != nullptr ? args : empty, kwargs);
    if (--self->busy == 0 && self->clear_when_idle) {  // closed while this op ran
      PyObject *type, *value, *tb;
      PyErr_Fetch(&type, &value, &tb);
      Dispatch_clear(found);
      PyErr_Restore(type, value, tb);
    }
  }
  Py_XDECREF(empty);
  Py_DECREF(found);
  return result;
}

PyMethodDef torch_dispatch_def = {
    "__torch_dispatch__", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(torch_dispatch)),
    METH_FASTCALL | METH_KEYWORDS, "optrace's dispatch hook (tracer/native/_dispatch.cpp)"};

// ------------------------------------------------------------------------------------------ Dispatch type
PyObject* spec_item(PyObject* spec, const char* key) {
  PyObject* v = PyDict_GetItemString(spec, key);  // borrowed
  if (v == nullptr) {
    PyErr_Format(PyExc_KeyError, "optrace dispatch: spec has no %s", key);
  }
  return v;
}

int spec_int(PyObject* spec, const char* key, int64_t* out) {
  PyObject* v = spec_item(spec, key);
  if (v == nullptr) {
    return -1;
  }
  *out = PyLong_AsLongLong(v);
  return (*out == -1 && PyErr_Occurred()) ? -1 : 0;
}

// the fields the row above packs, in order: tracer.store.writer ROW_FIELDS must be these
const char* const ROW[] = {
    "step", "op", "phase", "module", "device", "kind", "inplace", "causal",
    "flops", "bytes_allocated", "live_bytes", "inplace_bytes", "out_bytes", "duration_ns",
    "inputs", "outputs", "freed",
    "recompute", "start", "busy_ns", "layout", "comm_bytes", "group_size", "process_group",
    "bound", "groups", "grad_mode",
};

int Dispatch_init(PyObject* o, PyObject* args, PyObject* kwds) {
  auto* self = reinterpret_cast<Dispatch*>(o);
  PyObject *tracer, *hook, *spec;
  if (!PyArg_ParseTuple(args, "OOO!:Dispatch", &tracer, &hook, &PyDict_Type, &spec)) {
    return -1;
  }
  PyObject* fields = spec_item(spec, "row_fields");
  if (fields == nullptr) {
    return -1;
  }
  constexpr Py_ssize_t width = sizeof(ROW) / sizeof(ROW[0]);
  if (!PyTuple_Check(fields) || PyTuple_GET_SIZE(fields) != width) {
    PyErr_Format(PyExc_ValueError, "optrace dispatch: the row has %zd fields here, ROW_FIELDS %R", width, fields);
    return -1;
  }
  for (Py_ssize_t i = 0; i < width; i++) {
    const char* name = PyUnicode_AsUTF8(PyTuple_GET_ITEM(fields, i));
    if (name == nullptr || std::string(name) != ROW[i]) {
      if (!PyErr_Occurred()) {
        PyErr_Format(PyExc_ValueError, "optrace dispatch: row field %zd is %s here, %R in ROW_FIELDS", i, ROW[i],
                     PyTuple_GET_ITEM(fields, i));
      }
      return -1;
    }
  }
  Constants& k = self->k;
  unsigned long long no_seq;
  PyObject* no_seq_obj = spec_item(spec, "no_sequence_nr");
  if (no_seq_obj == nullptr || ((no_seq = PyLong_AsUnsignedLongLong(no_seq_obj)) == static_cast<unsigned long long>(-1) &&
                                PyErr_Occurred())) {
    return -1;
  }
  k.no_sequence_nr = no_seq;
  if (spec_int(spec, "forward", &k.forward) < 0 || spec_int(spec, "backward", &k.backward) < 0 ||
      spec_int(spec, "optimizer", &k.optimizer) < 0 || spec_int(spec, "causal_none", &k.causal_none) < 0 ||
      spec_int(spec, "no_value", &k.no_value) < 0 || spec_int(spec, "per_output_element", &k.per_output_element) < 0 ||
      spec_int(spec, "int64_max", &k.int64_max) < 0 || spec_int(spec, "basis_zero", &k.basis_zero) < 0 ||
      spec_int(spec, "basis_per_element", &k.basis_per_element) < 0 ||
      spec_int(spec, "basis_formula", &k.basis_formula) < 0 || spec_int(spec, "basis_detailed", &k.basis_detailed) < 0 ||
      spec_int(spec, "not_recompute", &k.not_recompute) < 0 || spec_int(spec, "recompute", &k.recompute) < 0 ||
      spec_int(spec, "grad", &k.grad) < 0 || spec_int(spec, "no_grad", &k.no_grad) < 0 ||
      spec_int(spec, "inference_mode", &k.inference_mode) < 0) {
    return -1;
  }
  PyObject *op_info_type = spec_item(spec, "op_info_type"), *plain = spec_item(spec, "plain_types"),
           *op_call = spec_item(spec, "op_call");
  if (op_info_type == nullptr || plain == nullptr || op_call == nullptr) {
    return -1;
  }
  if (!PyTuple_Check(plain) || PyTuple_GET_SIZE(plain) != 2) {
    PyErr_SetString(PyExc_TypeError, "optrace dispatch: plain_types must be (Tensor, Parameter)");
    return -1;
  }
  // perf_counter_ns must be the clock read here (CLOCK_MONOTONIC on Linux): within a second of it
  PyObject* time = PyImport_ImportModule("time");
  PyObject* perf = time == nullptr ? nullptr : PyObject_CallMethod(time, "perf_counter_ns", nullptr);
  Py_XDECREF(time);
  if (perf == nullptr) {
    return -1;
  }
  int64_t python_now = PyLong_AsLongLong(perf);
  Py_DECREF(perf);
  if (python_now == -1 && PyErr_Occurred()) {
    return -1;
  }
  int64_t gap = now_ns() - python_now;
  if (gap < -1000000000LL || gap > 1000000000LL) {
    PyErr_SetString(PyExc_RuntimeError, "optrace dispatch: time.perf_counter_ns is not CLOCK_MONOTONIC here");
    return -1;
  }
  PyObject* tracer_dict = instance_dict(tracer);
  if (tracer_dict == nullptr) {
    return -1;
  }
  PyObject *storages = item(tracer_dict, s__storages), *attr = item(tracer_dict, s__attr),
           *steps = item(tracer_dict, s__steps), *ctx = item(tracer_dict, s__collect_ctx);
  if (storages == nullptr || attr == nullptr || steps == nullptr || ctx == nullptr) {
    if (!PyErr_Occurred()) {
      PyErr_SetString(PyExc_AttributeError, "optrace dispatch: the tracer is not started");
    }
    Py_DECREF(tracer_dict);
    return -1;
  }
  if (!PyTuple_Check(ctx) || PyTuple_GET_SIZE(ctx) != CTX_WIDTH) {
    PyErr_SetString(PyExc_TypeError, "optrace dispatch: bad collector context");
    Py_DECREF(tracer_dict);
    return -1;
  }
  PyObject* storages_dict = instance_dict(storages);
  PyObject* attr_dict = storages_dict == nullptr ? nullptr : instance_dict(attr);
  PyObject* steps_dict = attr_dict == nullptr ? nullptr : instance_dict(steps);
  if (steps_dict == nullptr) {
    Py_XDECREF(storages_dict);
    Py_XDECREF(attr_dict);
    Py_DECREF(tracer_dict);
    return -1;
  }
  self->tracer = Py_NewRef(tracer);
  self->tracer_dict = tracer_dict;
  self->hook = Py_NewRef(hook);
  self->storages = Py_NewRef(storages);
  self->storages_dict = storages_dict;
  self->attr = Py_NewRef(attr);
  self->attr_dict = attr_dict;
  self->steps_dict = steps_dict;
  self->ctx = Py_NewRef(ctx);
  self->op_info_type = Py_NewRef(op_info_type);
  self->plain_types = Py_NewRef(plain);
  self->op_call = Py_NewRef(op_call);
  self->closed = false;
  return 0;
}

PyObject* Dispatch_new(PyTypeObject* type, PyObject*, PyObject*) {
  auto* self = reinterpret_cast<Dispatch*>(type->tp_alloc(type, 0));
  if (self != nullptr) {
    self->ops = new std::unordered_map<PyObject*, Op>();
    self->closed = true;  // until __init__ ran
    self->busy = 0;
    self->clear_when_idle = false;
    self->recorded = 0;
    self->recording = 0;
    self->held = false;
  }
  return reinterpret_cast<PyObject*>(self);
}

int Dispatch_traverse(PyObject* o, visitproc visit, void* arg) {
  auto* self = reinterpret_cast<Dispatch*>(o);
  Py_VISIT(self->tracer);
  Py_VISIT(self->tracer_dict);
  Py_VISIT(self->hook);
  Py_VISIT(self->storages);
  Py_VISIT(self->storages_dict);
  Py_VISIT(self->attr);
  Py_VISIT(self->attr_dict);
  Py_VISIT(self->steps_dict);
  Py_VISIT(self->ctx);
  Py_VISIT(self->rows);
  Py_VISIT(self->timer);
  if (self->ops != nullptr) {
    for (auto& [func, op] : *self->ops) {
      Py_VISIT(op.info);
      Py_VISIT(op.count);
      Py_VISIT(op.causal);
    }
  }
  return 0;
}

int Dispatch_clear(PyObject* o) {
  auto* self = reinterpret_cast<Dispatch*>(o);
  self->closed = true;
  self->clear_when_idle = false;
  Py_CLEAR(self->tracer);
  Py_CLEAR(self->tracer_dict);
  Py_CLEAR(self->hook);
  Py_CLEAR(self->storages);
  Py_CLEAR(self->storages_dict);
  Py_CLEAR(self->attr);
  Py_CLEAR(self->attr_dict);
  Py_CLEAR(self->steps_dict);
  Py_CLEAR(self->ctx);
  Py_CLEAR(self->op_info_type);
  Py_CLEAR(self->plain_types);
  Py_CLEAR(self->op_call);
  Py_CLEAR(self->rows);
  Py_CLEAR(self->ints);
  for (auto& buffer : self->side_bufs) {
    Py_CLEAR(buffer);
  }
  Py_CLEAR(self->freed_buf);
  Py_CLEAR(self->groups_buf);
  Py_CLEAR(self->timer);
  if (self->ops != nullptr) {
    auto ops = std::move(*self->ops);  // cleared before the references go: a finaliser may call back
    self->ops->clear();
    for (auto& [func, op] : ops) {
      clear_op(op);
    }
  }
  return 0;
}

void Dispatch_dealloc(PyObject* o) {
  PyObject_GC_UnTrack(o);
  Dispatch_clear(o);
  delete reinterpret_cast<Dispatch*>(o)->ops;
  Py_TYPE(o)->tp_free(o);
}

// close(): later ops reaching a mode bound to it go to the mode's class; every reference is dropped, at once or,
// while ops run inside it (on another thread), when the last of them returns.
PyObject* Dispatch_close(PyObject* o, PyObject*) {
  auto* self = reinterpret_cast<Dispatch*>(o);
  self->closed = true;
  if (self->busy) {
    self->clear_when_idle = true;
  } else {
    Dispatch_clear(o);
  }
  Py_RETURN_NONE;
}

PyObject* Dispatch_ops(PyObject* o, PyObject*) {
  return PyLong_FromSize_t(reinterpret_cast<Dispatch*>(o)->ops->size());
}

PyObject* Dispatch_recorded(PyObject* o, PyObject*) {
  return PyLong_FromLongLong(reinterpret_cast<Dispatch*>(o)->recorded);
}

PyObject* Dispatch_recording(PyObject* o, PyObject*) {
  return PyBool_FromLong(reinterpret_cast<Dispatch*>(o)->recording > 0);
}

PyObject* Dispatch_hold(PyObject* o, PyObject*) {
  reinterpret_cast<Dispatch*>(o)->held = true;
  Py_RETURN_NONE;
}

PyMethodDef Dispatch_methods[] = {
    {"close", Dispatch_close, METH_NOARGS, "drop every reference: the hook then hands every op to Python"},
    {"ops", Dispatch_ops, METH_NOARGS, "how many ops the table holds"},
    {"recorded", Dispatch_recorded, METH_NOARGS, "how many rows the hook wrote itself (the others, Python's)"},
    {"recording", Dispatch_recording, METH_NOARGS, "whether a row is being made (a signal now is held: hold())"},
    {"hold", Dispatch_hold, METH_NOARGS, "call Tracer._signal_due once the row being made is whole"},
    {nullptr, nullptr, 0, nullptr},
};

// dispatch_for(mode): the builtin `__torch_dispatch__` bound to `mode`, which must hold its Dispatch in `_hot`.
PyObject* dispatch_for(PyObject*, PyObject* mode) {
  return PyCFunction_NewEx(&torch_dispatch_def, mode, nullptr);
}

}  // namespace

PyMethodDef dispatch_methods[] = {
    {"dispatch_for", dispatch_for, METH_O, "dispatch_for(mode): the mode's __torch_dispatch__ in C++"},
    {nullptr, nullptr, 0, nullptr},
};

int dispatch_init(PyObject* module) {
#define OPTRACE_INTERN(n) \
  if ((s_##n = PyUnicode_InternFromString(#n)) == nullptr) return -1;
  OPTRACE_NAMES(OPTRACE_INTERN)
#undef OPTRACE_INTERN
  Py_SETREF(s_inline_, PyUnicode_InternFromString("inline"));  // a C++ keyword: named inline_ above
  if (s_inline_ == nullptr || (s_empty = PyUnicode_InternFromString("")) == nullptr) {
    return -1;
  }
  DispatchType.tp_name = "tracer.native._collector.Dispatch";
  DispatchType.tp_basicsize = sizeof(Dispatch);
  DispatchType.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC;
  DispatchType.tp_doc = "Dispatch(tracer, hook, spec): the C++ dispatch hook's state for one trace (tracer/native/_dispatch.cpp)";
  DispatchType.tp_new = Dispatch_new;
  DispatchType.tp_init = Dispatch_init;
  DispatchType.tp_dealloc = Dispatch_dealloc;
  DispatchType.tp_traverse = Dispatch_traverse;
  DispatchType.tp_clear = Dispatch_clear;
  DispatchType.tp_methods = Dispatch_methods;
  if (PyType_Ready(&DispatchType) < 0) {
    return -1;
  }
  Py_INCREF(&DispatchType);
  return PyModule_AddObject(module, "Dispatch", reinterpret_cast<PyObject*>(&DispatchType));
}

}  // namespace optrace
