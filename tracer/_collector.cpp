// The compiled collector: what `Tracer._record` reads from an op's tensors, in one call.
//
// `collect(ctx, args, kwargs, out, tensors, dims)` finds the tensor arguments (one level into
// lists, as tracer/dispatch.py `_tensors` does) and the tensor outputs of an op, and appends, for
// each, the same integers the pure-Python loop in tracer/mode.py appends: ndim, dtype id, storage
// id and storage bytes to `tensors`, then its sizes and strides to `dims` (both `array('q')`).
// Dictionaries and callbacks are the tracer's own (ctx, built by tracer/native.py), so storage
// and dtype ids are given out in the same order as the Python path gives them.
//
// It returns (inputs, outputs, registered bytes after the inputs, device key), or None, having
// changed nothing, when any tensor is not a plain strided one (a subclass other than Parameter,
// sparse, nested, symbolic sizes, no storage): the Python path then records the op.
//
// Built at install time by tracer/build_ext.py with torch's extension tooling; the Python path
// runs when it is missing or was built for another torch (tracer/native.py).

#include <torch/csrc/DynamicTypes.h>
#include <torch/csrc/autograd/python_variable.h>

#include <cstdint>
#include <vector>

#ifndef OPTRACE_TORCH_VERSION
#define OPTRACE_TORCH_VERSION "unknown"
#endif

namespace {

// ctx: (storage key -> id, id -> bytes, dtype -> dtype id, device key -> device id,
//       register(tensor) -> storage id, new_dtype(dtype) -> dtype id, the StorageTable)
enum { BY_CDATA, SIZE, DTYPE_IDS, REGISTER, NEW_DTYPE, STORAGES, CTX_WIDTH };

PyObject* frombytes_name = nullptr;
PyObject* registered_name = nullptr;

bool is_tensor(PyObject* o, int* error) {
  if (THPVariable_CheckExact(o)) {
    return true;
  }
  int found = PyObject_IsInstance(o, THPVariableClass);
  if (found < 0) {
    *error = 1;
  }
  return found > 0;
}

// Appends the tensors among `o`, looking one level into lists and tuples.
int gather(PyObject* o, PyObject* found) {
  int error = 0;
  if (is_tensor(o, &error)) {
    return PyList_Append(found, o);
  }
  if (error) {
    return -1;
  }
  if (PyList_Check(o) || PyTuple_Check(o)) {
    PyObject* seq = o;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    for (Py_ssize_t i = 0; i < n; i++) {
      PyObject* item = PySequence_Fast_GET_ITEM(seq, i);
      if (is_tensor(item, &error)) {
        if (PyList_Append(found, item) < 0) {
          return -1;
        }
      } else if (error) {
        return -1;
      }
    }
  }
  return 0;
}

// A tensor the fast path can read: exactly Tensor or Parameter, strided, not nested, with
// concrete sizes and a storage.
bool plain(PyObject* o) {
  if (!THPVariable_CheckExact(o)) {
    return false;
  }
  const at::Tensor& t = THPVariable_Unpack(o);
  if (!t.defined()) {
    return false;
  }
  c10::TensorImpl* impl = t.unsafeGetTensorImpl();
  return impl->layout() == c10::kStrided && !impl->is_nested() && !impl->has_symbolic_sizes_strides() &&
      impl->has_storage();
}

// The value of `key` in `dict`, or the result of `make(arg)` when absent: a new reference.
PyObject* lookup(PyObject* dict, PyObject* key, PyObject* make, PyObject* arg) {
  PyObject* value = PyDict_GetItemWithError(dict, key);
  if (value != nullptr) {
    Py_INCREF(value);
    return value;
  }
  if (PyErr_Occurred()) {
    return nullptr;
  }
  return PyObject_CallOneArg(make, arg);
}

// One tensor's record; -1 with a Python error set on failure.
int describe(PyObject* const* ctx, PyObject* o, std::vector<int64_t>& tensors, std::vector<int64_t>& dims) {
  c10::TensorImpl* impl = THPVariable_Unpack(o).unsafeGetTensorImpl();
  PyObject* key = PyLong_FromVoidPtr(impl->storage().unsafeGetStorageImpl());
  if (key == nullptr) {
    return -1;
  }
  PyObject* sid = lookup(ctx[BY_CDATA], key, ctx[REGISTER], o);
  Py_DECREF(key);
  if (sid == nullptr) {
    return -1;
  }
  PyObject* size = PyDict_GetItemWithError(ctx[SIZE], sid);  // borrowed
  if (size == nullptr) {
    if (!PyErr_Occurred()) {
      PyErr_SetString(PyExc_KeyError, "optrace collector: a storage id without a size");
    }
    Py_DECREF(sid);
    return -1;
  }
  int64_t sid_value = PyLong_AsLongLong(sid);
  int64_t size_value = PyLong_AsLongLong(size);
  Py_DECREF(sid);
  PyObject* dtype = reinterpret_cast<PyObject*>(torch::getTHPDtype(impl->dtype().toScalarType()));
  PyObject* dtype_id = lookup(ctx[DTYPE_IDS], dtype, ctx[NEW_DTYPE], dtype);
  if (dtype_id == nullptr) {
    return -1;
  }
  int64_t dtype_value = PyLong_AsLongLong(dtype_id);
  Py_DECREF(dtype_id);
  if (PyErr_Occurred()) {
    return -1;
  }
  c10::IntArrayRef sizes = impl->sizes();
  c10::IntArrayRef strides = impl->strides();
  tensors.insert(tensors.end(), {static_cast<int64_t>(sizes.size()), dtype_value, sid_value, size_value});
  dims.insert(dims.end(), sizes.begin(), sizes.end());
  dims.insert(dims.end(), strides.begin(), strides.end());
  return 0;
}

int append(PyObject* array, const std::vector<int64_t>& values) {
  PyObject* bytes = PyBytes_FromStringAndSize(
      reinterpret_cast<const char*>(values.data()), static_cast<Py_ssize_t>(values.size() * sizeof(int64_t)));
  if (bytes == nullptr) {
    return -1;
  }
  PyObject* done = PyObject_CallMethodOneArg(array, frombytes_name, bytes);
  Py_DECREF(bytes);
  if (done == nullptr) {
    return -1;
  }
  Py_DECREF(done);
  return 0;
}

PyObject* collect_impl(PyObject* const* args) {
  PyObject* ctx_tuple = args[0];
  if (!PyTuple_Check(ctx_tuple) || PyTuple_GET_SIZE(ctx_tuple) != CTX_WIDTH) {
    PyErr_SetString(PyExc_TypeError, "optrace collector: bad context");
    return nullptr;
  }
  PyObject* const* ctx = &PyTuple_GET_ITEM(ctx_tuple, 0);
  PyObject *op_args = args[1], *op_kwargs = args[2], *out = args[3];
  PyObject* ins = PyList_New(0);
  PyObject* outs = PyList_New(0);
  PyObject* result = nullptr;
  if (ins == nullptr || outs == nullptr) {
    goto done;
  }
  if (PyTuple_Check(op_args)) {
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(op_args); i++) {
      if (gather(PyTuple_GET_ITEM(op_args, i), ins) < 0) {
        goto done;
      }
    }
  }
  if (op_kwargs != Py_None && PyDict_Check(op_kwargs)) {
    Py_ssize_t pos = 0;
    PyObject *k, *v;
    while (PyDict_Next(op_kwargs, &pos, &k, &v)) {
      if (gather(v, ins) < 0) {
        goto done;
      }
    }
  }
  if (gather(out, outs) < 0) {
    goto done;
  }
  {
    Py_ssize_t n_in = PyList_GET_SIZE(ins), n_out = PyList_GET_SIZE(outs);
    for (Py_ssize_t i = 0; i < n_in + n_out; i++) {
      if (!plain(i < n_in ? PyList_GET_ITEM(ins, i) : PyList_GET_ITEM(outs, i - n_in))) {
        result = Py_NewRef(Py_None);  // the Python path records this op
        goto done;
      }
    }
    std::vector<int64_t> tensors, dims;
    tensors.reserve(4 * (n_in + n_out));
    dims.reserve(16 * (n_in + n_out));
    PyObject* registered = nullptr;
    int64_t device_key = -1;
    try {
      for (Py_ssize_t i = 0; i < n_in + n_out; i++) {
        if (i == n_in) {  // storages first seen as outputs were made by this op
          registered = PyObject_GetAttr(ctx[STORAGES], registered_name);
          if (registered == nullptr) {
            goto done;
          }
        }
        if (describe(ctx, i < n_in ? PyList_GET_ITEM(ins, i) : PyList_GET_ITEM(outs, i - n_in), tensors, dims) < 0) {
          Py_XDECREF(registered);
          goto done;
        }
      }
      if (registered == nullptr) {
        registered = PyObject_GetAttr(ctx[STORAGES], registered_name);
        if (registered == nullptr) {
          goto done;
        }
      }
      if (n_in + n_out) {
        const c10::Device device = THPVariable_Unpack(n_in ? PyList_GET_ITEM(ins, 0) : PyList_GET_ITEM(outs, 0)).device();
        device_key = (static_cast<int64_t>(device.type()) << 16) | (static_cast<int64_t>(device.index()) + 1);
      }
    } catch (const std::exception& e) {
      Py_XDECREF(registered);
      if (!PyErr_Occurred()) {
        PyErr_SetString(PyExc_RuntimeError, e.what());
      }
      goto done;
    }
    if (append(args[4], tensors) < 0 || append(args[5], dims) < 0) {
      Py_DECREF(registered);
      goto done;
    }
    result = Py_BuildValue("(OONL)", ins, outs, registered, static_cast<long long>(device_key));
  }
done:
  Py_XDECREF(ins);
  Py_XDECREF(outs);
  return result;
}

PyObject* collect(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 6) {
    PyErr_SetString(PyExc_TypeError, "collect(ctx, args, kwargs, out, tensors, dims) takes 6 arguments");
    return nullptr;
  }
  return collect_impl(args);
}

PyObject* storage_key(PyObject*, PyObject* o) {
  if (!THPVariable_Check(o)) {
    PyErr_SetString(PyExc_TypeError, "storage_key expects a tensor");
    return nullptr;
  }
  return PyLong_FromVoidPtr(THPVariable_Unpack(o).unsafeGetTensorImpl()->storage().unsafeGetStorageImpl());
}

PyMethodDef methods[] = {
    {"collect", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(collect)), METH_FASTCALL,
     "collect(ctx, args, kwargs, out, tensors, dims): (inputs, outputs, registered bytes, device key) or None"},
    {"storage_key", storage_key, METH_O, "the key of a tensor's storage (its StorageImpl address)"},
    {nullptr, nullptr, 0, nullptr},
};

PyModuleDef module = {PyModuleDef_HEAD_INIT, "_collector", "optrace's compiled collector", -1, methods};

}  // namespace

PyMODINIT_FUNC PyInit__collector(void) {
  frombytes_name = PyUnicode_InternFromString("frombytes");
  registered_name = PyUnicode_InternFromString("registered_bytes");
  PyObject* m = PyModule_Create(&module);
  if (m == nullptr || PyModule_AddStringConstant(m, "torch_version", OPTRACE_TORCH_VERSION) < 0) {
    Py_XDECREF(m);
    return nullptr;
  }
  return m;
}
