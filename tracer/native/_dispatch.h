// What the dispatch hook's files share: tracer/native/_dispatch.cpp (the hook, its op table and the row),
// tracer/native/_where.cpp (the common cases of attribution) and tracer/native/_native_flops.cpp (the FLOP formulas counted
// in C++). The tensor reading they use is tracer/native/_collector.h's.
#pragma once

#include "_collector.h"

#include <cstdint>

namespace optrace {

// Interned attribute names, made at import.
#define OPTRACE_NAMES(X)                                                                                           \
  X(_hot) X(_info) X(_rows) X(_timer) X(_storages) X(_attr) X(_steps) X(_collect_ctx) X(_module_ids)             \
  X(_device_keys) X(_flush_at) X(_flush_values) X(_record) X(_record_failed) X(_new_module) X(_device_of) X(_flush) X(ints)       \
  X(_signal_due)                                                                                                  \
  X(sides) X(freed) X(groups) X(_dead) X(collect) X(step) X(inline_) X(binds) X(start) X(stop) X(bind) X(where) \
  X(trained) X(recompute_stack) X(backward_stack) X(forward_stack) X(_task) X(_task_grad) X(_recompute_region)    \
  X(_nested) X(_named_left) X(_node_key) X(_last_module) X(_node_module) X(_event_seqs) X(_event_names)          \
  X(in_optimizer) X(_closure) X(_in_closure) X(_optimizer_ops) X(_op) X(__call__) X(name) X(name_id) X(kind_id) \
  X(inplace) X(basis) X(rule) X(count) X(causal) X(collective) X(written_positions) X(written_names)             \
  X(out_only) X(live_bytes) X(native) X(_refs) X(_by_cdata) X(size) X(hollow) X(registered_bytes) X(next_id)
#define OPTRACE_EXTERN(n) extern PyObject* s_##n;
OPTRACE_NAMES(OPTRACE_EXTERN)
#undef OPTRACE_EXTERN
extern PyObject* s_empty;  // ""

// The phase, FLOP-basis, grad-mode and sentinel values the row holds: tracer/schema.py's, passed in `spec` so
// that nothing here restates them (checked in Dispatch's constructor).
struct Constants {
  int64_t forward, backward, optimizer;
  int64_t causal_none, no_value, per_output_element, int64_max;
  int64_t basis_zero, basis_per_element, basis_formula, basis_detailed;
  int64_t not_recompute, recompute;
  int64_t grad, no_grad, inference_mode;  // tracer.schema.GradMode
  uint64_t no_sequence_nr;
};

// The counts computed here rather than called in Python (tracer.flops.op_kinds `native_count`).
enum Native {
  IN_PYTHON, MM, ADDMM, BMM, BADDBMM, SOFTMAX, SOFTMAX_BACKWARD, LAYER_NORM, LAYER_NORM_BACKWARD, NUMEL_FIRST,
  NUMEL_FIRST_LIST,
};

// Native for a name of tracer.flops.op_kinds `native_count`; IN_PYTHON for None or a name unknown here.
Native native_named(const char* name);

// The FLOPs of a count computed here (tracer/native/_native_flops.cpp): 1 with *flops set; 0 when the Python count must
// decide.
int native_flops(Native native, PyObject* args, PyObject* kwargs, int64_t* flops);

// Attribution.where's common cases (tracer/native/_where.cpp): 1 with *phase, *module (a new reference) and *recompute
// set; 0 when `where` must decide; -1 with an error set.
int fast_where(PyObject* attr_dict, const Constants& k, int64_t* phase, PyObject** module, int64_t* recompute);

// StorageTable.collect (tracer.recording.storage) on the table's instance dict (tracer/native/_collector.cpp).
int collect_frees(PyObject* storages_dict);

// A borrowed item of a dict, KeyError-free: nullptr with no error set when absent.
inline PyObject* item(PyObject* dict, PyObject* key) {
  return PyDict_GetItemWithError(dict, key);
}

// dict[key] as int64 into *value; -1 with an error set when absent or not an int.
inline int item_int(PyObject* dict, PyObject* key, int64_t* value) {
  PyObject* o = item(dict, key);
  if (o == nullptr) {
    if (!PyErr_Occurred()) {
      PyErr_Format(PyExc_AttributeError, "optrace dispatch: no attribute %R", key);
    }
    return -1;
  }
  *value = PyLong_AsLongLong(o);
  return (*value == -1 && PyErr_Occurred()) ? -1 : 0;
}

inline int set_int(PyObject* dict, PyObject* key, int64_t value) {
  PyObject* o = PyLong_FromLongLong(value);
  if (o == nullptr) {
    return -1;
  }
  int rc = PyDict_SetItem(dict, key, o);
  Py_DECREF(o);
  return rc;
}

inline PyObject* instance_dict(PyObject* o) {
  PyObject* d = PyObject_GenericGetDict(o, nullptr);
  if (d != nullptr && !PyDict_Check(d)) {
    Py_DECREF(d);
    PyErr_SetString(PyExc_TypeError, "optrace dispatch: an instance dict is not a dict");
    return nullptr;
  }
  return d;
}

}  // namespace optrace
