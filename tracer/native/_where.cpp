// Attribution.where's common cases in C++ (tracer.recording.attribution), for the compiled dispatch hook
// (tracer/native/_dispatch.cpp): an op inside a module's forward, an op of a backward engine run already begun (the
// module of the autograd node running it), an optimizer step's op. Every other case (a new engine run, a
// checkpoint's re-run region, ops outside any module but the optimizer's) is `where`'s, called in Python. The
// state is the Attribution's own attributes, read and written through its instance dict, so the Python
// `where` and the hooks see what this wrote.

#include "_dispatch.h"

#include <c10/core/GradMode.h>
#include <cstring>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/graph_task.h>
#include <torch/csrc/autograd/python_cpp_function.h>

namespace optrace {
namespace {

const int EMPTY = 2;

// The module of the (key, module) pair on top of the attribution's stack `name` (a list): 1 with *module set,
// EMPTY for an empty stack, 0 for one not as the tracer writes it (where decides), -1 with an error set.
int stack_top(PyObject* d, PyObject* name, PyObject** module) {
  PyObject* stack = item(d, name);
  if (stack == nullptr || !PyList_Check(stack)) {
    return PyErr_Occurred() ? -1 : 0;
  }
  Py_ssize_t n = PyList_GET_SIZE(stack);
  if (n == 0) {
    return EMPTY;
  }
  PyObject* top = PyList_GET_ITEM(stack, n - 1);
  if (!PyTuple_Check(top) || PyTuple_GET_SIZE(top) != 2) {
    return 0;
  }
  *module = Py_NewRef(PyTuple_GET_ITEM(top, 1));
  return 1;
}

}  // namespace

int fast_where(PyObject* d, const Constants& k, int64_t* phase, PyObject** module, int64_t* recompute) {
  int64_t task = torch::autograd::get_current_graph_task_id();
  if (task == -1) {
    int top = stack_top(d, s_forward_stack, module);
    if (top != EMPTY) {
      *phase = k.forward;
      *recompute = k.not_recompute;
      return top;
    }
    PyObject* in_optimizer = item(d, s_in_optimizer);
    PyObject* closure = item(d, s__closure);
    PyObject* in_closure = item(d, s__in_closure);
    if (in_optimizer != Py_True || closure != Py_False || in_closure == nullptr || !PyLong_CheckExact(in_closure) ||
        PyLong_AsLong(in_closure) != 0) {
      return PyErr_Occurred() ? -1 : 0;
    }
    int64_t ops;
    if (item_int(d, s__optimizer_ops, &ops) < 0 || set_int(d, s__optimizer_ops, ops + 1) < 0) {
      return -1;
    }
    *phase = k.optimizer;
    *module = Py_NewRef(s_empty);
    *recompute = k.not_recompute;
    return 1;
  }
  if (item(d, s_trained) != Py_True && PyDict_SetItem(d, s_trained, Py_True) < 0) {
    return -1;
  }
  int top = stack_top(d, s_recompute_stack, module);
  if (top != EMPTY) {
    *phase = k.backward;
    *recompute = k.recompute;
    return top;
  }
  int64_t seen_task;
  if (item_int(d, s__task, &seen_task) < 0) {
    return -1;
  }
  if (task != seen_task) {  // a new engine run: its bookkeeping is where's
    return 0;
  }
  PyObject* task_grad = item(d, s__task_grad);
  if (task_grad == nullptr) {
    return PyErr_Occurred() ? -1 : 0;
  }
  int task_grad_on = PyObject_IsTrue(task_grad);
  if (task_grad_on < 0) {
    return -1;
  }
  *recompute = c10::GradMode::is_enabled() && !task_grad_on ? k.recompute : k.not_recompute;
  PyObject* stack = item(d, s_backward_stack);
  if (stack == nullptr || !PyList_Check(stack)) {
    return PyErr_Occurred() ? -1 : 0;
  }
  if (PyList_GET_SIZE(stack)) {
    PyObject* top = PyList_GET_ITEM(stack, PyList_GET_SIZE(stack) - 1);
    if (!PyTuple_Check(top) || PyTuple_GET_SIZE(top) < 1) {
      return 0;
    }
    *phase = k.backward;
    *module = Py_NewRef(PyTuple_GET_ITEM(top, 0));
    return 1;
  }
  PyObject* region = item(d, s__recompute_region);
  PyObject* nested = item(d, s__nested);
  if (region != Py_None || nested == nullptr || !PyDict_Check(nested) || PyDict_GET_SIZE(nested)) {
    return PyErr_Occurred() ? -1 : 0;
  }
  // Attribution._backward_module
  int64_t named_left;
  if (item_int(d, s__named_left, &named_left) < 0) {
    return -1;
  }
  if (named_left <= 0) {
    return 0;
  }
  *phase = k.backward;
  auto node = torch::autograd::get_current_node();
  if (!node) {  // an engine callback: no node made it
    *module = Py_NewRef(s_empty);
    return 1;
  }
  // the key is (id of the node's Python object, its sequence number), as where's: that object lives as long as
  // the node
  PyObject* py_node = torch::autograd::functionToPyObject(node);
  if (py_node == nullptr) {
    return -1;
  }
  uint64_t seq = node->sequence_nr();
  void* node_id = py_node;
  Py_DECREF(py_node);
  PyObject* key = item(d, s__node_key);
  if (key != nullptr && PyTuple_Check(key) && PyTuple_GET_SIZE(key) == 2 && PyLong_Check(PyTuple_GET_ITEM(key, 0)) &&
      PyLong_Check(PyTuple_GET_ITEM(key, 1))) {
    void* key_id = PyLong_AsVoidPtr(PyTuple_GET_ITEM(key, 0));
    uint64_t key_seq = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(key, 1));
    if (PyErr_Occurred()) {
      return -1;
    }
    if (key_id == node_id && key_seq == seq) {
      PyObject* last = item(d, s__last_module);
      if (last == nullptr) {
        return PyErr_Occurred() ? -1 : 0;
      }
      *module = Py_NewRef(last);
      return 1;
    }
  } else if (PyErr_Occurred()) {
    return -1;
  }
  PyObject* node_module = item(d, s__node_module);
  if (node_module == nullptr) {
    return PyErr_Occurred() ? -1 : 0;
  }
  Py_INCREF(node_module);  // held across the writes below
  PyObject* new_key = Py_BuildValue("(NK)", PyLong_FromVoidPtr(node_id), static_cast<unsigned long long>(seq));
  int rc = new_key == nullptr ? -1 : PyDict_SetItem(d, s__node_key, new_key);
  Py_XDECREF(new_key);
  if (rc < 0 || set_int(d, s__named_left, named_left - 1) < 0) {
    Py_DECREF(node_module);
    return -1;
  }
  if (seq != k.no_sequence_nr) {  // AccumulateGrad runs as soon as the node before made its gradient: that one's module
    PyObject* seqs = item(d, s__event_seqs);
    PyObject* names = item(d, s__event_names);
    Py_buffer view;  // the sequence numbers: an array('Q'), read in place
    if (seqs == nullptr || names == nullptr || !PyList_Check(names) ||
        PyObject_GetBuffer(seqs, &view, PyBUF_FORMAT) < 0) {
      if (!PyErr_Occurred()) {
        PyErr_SetString(PyExc_TypeError, "optrace dispatch: the module boundaries are not an array('Q') and a list");
      }
      Py_DECREF(node_module);
      return -1;
    }
    Py_ssize_t n = view.len / 8;
    if (view.itemsize != 8 || view.format == nullptr || std::strcmp(view.format, "Q") != 0 ||
        n != PyList_GET_SIZE(names)) {
      PyBuffer_Release(&view);
      PyErr_SetString(PyExc_TypeError, "optrace dispatch: the module boundaries are not an array('Q') and a list of one length");
      Py_DECREF(node_module);
      return -1;
    }
    const uint64_t* boundaries = static_cast<const uint64_t*>(view.buf);
    Py_ssize_t lo = 0, hi = n;  // bisect.bisect_right(seqs, seq)
    while (lo < hi) {
      Py_ssize_t mid = (lo + hi) / 2;
      if (seq < boundaries[mid]) {
        hi = mid;
      } else {
        lo = mid + 1;
      }
    }
    PyBuffer_Release(&view);
    Py_SETREF(node_module, Py_NewRef(lo > 0 ? PyList_GET_ITEM(names, lo - 1) : s_empty));
    if (PyDict_SetItem(d, s__node_module, node_module) < 0) {
      Py_DECREF(node_module);
      return -1;
    }
  }
  if (PyDict_SetItem(d, s__last_module, node_module) < 0) {
    Py_DECREF(node_module);
    return -1;
  }
  *module = node_module;
  return 1;
}

}  // namespace optrace
