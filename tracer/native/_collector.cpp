// The compiled collector: what `Tracer._record` reads from an op's tensors, in one call.
//
// `collect(ctx, args, kwargs, out, written, sides)` finds the tensor arguments (one level into
// lists, as tracer.recording.dispatch `_tensors` does) and the tensor outputs of an op, and appends, for
// each, the same integers the pure-Python loop in tracer.recording.python_collector appends to its side's `array('q')`
// buffers (tracer.store.writer RowBuffer.sides): ndim, dtype id, storage id and storage bytes, its sizes,
// its strides.
// Dictionaries and callbacks are the tracer's own (ctx, built by tracer.recording.start), so storage
// and dtype ids are given out in the same order as the Python path gives them.
//
// A storage seen for the first time is registered here as StorageTable.register does it; the
// tensors the op wrote into (`written`: its (tensor, is_out) pairs, or None) give the in-place and
// out= bytes, and a storage resized in place calls StorageTable.regrow.
//
// It returns (inputs, outputs, registered bytes after the inputs, device key, in-place bytes,
// out= bytes), or None, having changed nothing, when any tensor is not a plain strided one (a
// subclass other than Parameter, sparse, nested, symbolic sizes, no storage): the Python path
// then records the op.
//
// Built at install time by tracer.native.build_ext with torch's extension tooling; the Python path
// runs when it is missing or was built for another torch (tracer.native.loader).

#include "_dispatch.h"  // with _collector.h: the interned names and dict helpers collect_frees uses

#include <torch/csrc/DynamicTypes.h>
#include <torch/csrc/Storage.h>
#include <torch/csrc/autograd/python_variable.h>

#include <algorithm>
#include <cstring>

#ifndef OPTRACE_TORCH_VERSION
#define OPTRACE_TORCH_VERSION "unknown"
#endif

namespace optrace {
namespace {

PyObject* frombytes_name = nullptr;

// storages.<name> += delta, in the StorageTable's dict `d`
int add_to(PyObject* d, PyObject* name, int64_t delta) {
  int64_t now;
  return item_int(d, name, &now) < 0 ? -1 : set_int(d, name, now + delta);
}

// StorageTable.register(t.untyped_storage()) in C++ (tracer.recording.storage): the next id, counted
// live and registered, with a weak reference whose finaliser notes the free. A new reference.
PyObject* register_storage(PyObject* const* ctx, c10::TensorImpl* impl, PyObject* key) {
  const c10::Storage& storage = impl->storage();
  int64_t nbytes = static_cast<int64_t>(storage.nbytes());
  PyObject* d = instance_dict(ctx[STORAGES]);
  if (d == nullptr) {
    return nullptr;
  }
  PyObject* sid = item(d, s_next_id);  // the id given out; next_id moves on
  if (sid == nullptr) {
    if (!PyErr_Occurred()) {
      PyErr_SetObject(PyExc_AttributeError, s_next_id);
    }
    Py_DECREF(d);
    return nullptr;
  }
  Py_INCREF(sid);
  PyObject *size = nullptr, *wrapped = nullptr, *ref = nullptr, *ref_id = nullptr, *entry = nullptr;
  if (add_to(d, s_next_id, 1) < 0) {
    goto fail;
  }
  size = PyLong_FromLongLong(nbytes);
  if (size == nullptr || PyDict_SetItem(ctx[BY_CDATA], key, sid) < 0 || PyDict_SetItem(ctx[SIZE], sid, size) < 0 ||
      add_to(d, s_live_bytes, nbytes) < 0 || add_to(d, s_registered_bytes, nbytes) < 0) {
    goto fail;
  }
  wrapped = THPStorage_Wrap(storage);
  if (wrapped == nullptr) {
    goto fail;
  }
  ref = PyWeakref_NewRef(wrapped, ctx[NOTE_FREE]);
  if (ref == nullptr) {
    goto fail;
  }
  ref_id = PyLong_FromVoidPtr(ref);
  entry = ref_id == nullptr ? nullptr : PyTuple_Pack(3, ref, key, sid);
  if (entry == nullptr || PyDict_SetItem(ctx[REFS], ref_id, entry) < 0) {
    goto fail;
  }
  Py_DECREF(d);
  Py_DECREF(size);
  Py_DECREF(wrapped);
  Py_DECREF(ref);
  Py_DECREF(ref_id);
  Py_DECREF(entry);
  return sid;
fail:
  Py_DECREF(d);
  Py_XDECREF(size);
  Py_XDECREF(wrapped);
  Py_XDECREF(ref);
  Py_XDECREF(ref_id);
  Py_XDECREF(entry);
  Py_DECREF(sid);
  return nullptr;
}

bool is_tensor(PyObject* o, int* error) {
  if (THPVariable_CheckExact(o)) {
    return true;
  }
  // the arguments that are most often not tensors: exact builtins, whose isinstance is false without a
  // look at their class (PyObject_IsInstance costs about 400 instructions here)
  if (o == Py_None || PyLong_CheckExact(o) || PyFloat_CheckExact(o) || PyBool_Check(o) || PyList_CheckExact(o) ||
      PyTuple_CheckExact(o) || PyUnicode_CheckExact(o)) {
    return false;
  }
  int found = PyObject_IsInstance(o, THPVariableClass);
  if (found < 0) {
    *error = 1;
  }
  return found > 0;
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
int describe(PyObject* const* ctx, PyObject* o, Side& side) {
  c10::TensorImpl* impl = THPVariable_Unpack(o).unsafeGetTensorImpl();
  PyObject* key = PyLong_FromVoidPtr(impl->storage().unsafeGetStorageImpl());
  if (key == nullptr) {
    return -1;
  }
  PyObject* sid = PyDict_GetItemWithError(ctx[BY_CDATA], key);
  if (sid != nullptr) {
    Py_INCREF(sid);
  } else if (!PyErr_Occurred()) {
    sid = register_storage(ctx, impl, key);
  }
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
  side.tensors.insert(side.tensors.end(), {static_cast<int64_t>(sizes.size()), dtype_value, sid_value, size_value});
  side.sizes.insert(side.sizes.end(), sizes.begin(), sizes.end());
  side.strides.insert(side.strides.end(), strides.begin(), strides.end());
  return 0;
}

// The bytes of the tensors an op wrote into (all of them; out= ones apart) and, for a storage an
// op resized in place, StorageTable.regrow (tracer.recording.storage), as the Python path does.
// The bytes of the tensors an op wrote into (all of them; out= ones apart) and, for a storage an
// op resized in place, StorageTable.regrow (tracer.recording.storage), as the Python path does.
int written_bytes(PyObject* const* ctx, const Written& written, int64_t* inplace_bytes, int64_t* out_bytes) {
  for (const auto& [o, is_out] : written) {
    if (!plain(o)) {  // the inputs were all plain; a written tensor is one of them
      continue;
    }
    c10::TensorImpl* impl = THPVariable_Unpack(o).unsafeGetTensorImpl();
    int64_t n = impl->numel() * static_cast<int64_t>(impl->itemsize());
    *inplace_bytes += n;
    if (is_out) {  // out= tensors are written, not read
      *out_bytes += n;
    }
    PyObject* key = PyLong_FromVoidPtr(impl->storage().unsafeGetStorageImpl());
    if (key == nullptr) {
      return -1;
    }
    PyObject* sid = PyDict_GetItemWithError(ctx[BY_CDATA], key);  // borrowed
    Py_DECREF(key);
    if (sid == nullptr) {
      if (PyErr_Occurred()) {
        return -1;
      }
      continue;
    }
    int hollow = PySet_Contains(ctx[HOLLOW], sid);
    if (hollow < 0) {
      return -1;
    }
    PyObject* size = PyDict_GetItemWithError(ctx[SIZE], sid);
    if (hollow || size == nullptr) {
      if (PyErr_Occurred()) {
        return -1;
      }
      continue;
    }
    if (PyLong_AsLongLong(size) != static_cast<int64_t>(impl->storage().nbytes())) {  // resized: rare
      PyObject* storage = THPStorage_Wrap(impl->storage());
      if (storage == nullptr) {
        return -1;
      }
      PyObject* done = PyObject_CallOneArg(ctx[REGROW], storage);
      Py_DECREF(storage);
      if (done == nullptr) {
        return -1;
      }
      Py_DECREF(done);
    }
  }
  return 0;
}

// Appends the tensors among `o` to `found`, looking one level into lists and tuples.
int gather_into(PyObject* o, std::vector<PyObject*>& found) {
  int error = 0;
  if (is_tensor(o, &error)) {
    found.push_back(o);
    return 0;
  }
  if (error) {
    return -1;
  }
  if (PyList_Check(o) || PyTuple_Check(o)) {
    Py_ssize_t n = PySequence_Fast_GET_SIZE(o);
    for (Py_ssize_t i = 0; i < n; i++) {
      PyObject* item = PySequence_Fast_GET_ITEM(o, i);
      if (is_tensor(item, &error)) {
        found.push_back(item);
      } else if (error) {
        return -1;
      }
    }
  }
  return 0;
}

}  // namespace

int64_t registered_bytes(PyObject* const* ctx, int* failed) {
  PyObject* d = instance_dict(ctx[STORAGES]);
  int64_t n = 0;
  if (d == nullptr || item_int(d, s_registered_bytes, &n) < 0) {
    *failed = 1;
  }
  Py_XDECREF(d);
  return n;
}

namespace {

// The layout of CPython's array object (Modules/arraymodule.c, unchanged from 3.3 to 3.13): appending
// into the room an array('q') already has is a memcpy, where its `frombytes` method costs a method call
// and a bytes object (about 1,650 instructions, 3 or 4 times per op). `array_layout_ok` says whether
// the layout was confirmed on a live array when the module was imported (check_array_layout); when it
// was not, every append goes through `frombytes`.
struct ArrayObject {
  PyObject_VAR_HEAD
  char* ob_item;
  Py_ssize_t allocated;
  const void* ob_descr;
  PyObject* weakreflist;
  Py_ssize_t ob_exports;
};
bool array_layout_ok = false;
PyTypeObject* array_type = nullptr;

int check_array_layout() {
  PyObject* module = PyImport_ImportModule("array");
  if (module == nullptr) {
    return -1;
  }
  PyObject* cls = PyObject_GetAttrString(module, "array");
  Py_DECREF(module);
  if (cls == nullptr) {
    return -1;
  }
  PyObject* probe = PyObject_CallFunction(cls, "s(LLL)", "q", 11LL, 22LL, 33LL);
  if (probe == nullptr) {
    Py_DECREF(cls);
    return -1;
  }
  auto* a = reinterpret_cast<ArrayObject*>(probe);
  bool ok = Py_TYPE(probe) == reinterpret_cast<PyTypeObject*>(cls) && Py_SIZE(probe) == 3 && a->allocated >= 3 &&
      a->ob_exports == 0 && a->ob_item != nullptr;
  if (ok) {
    Py_buffer view;
    if (PyObject_GetBuffer(probe, &view, PyBUF_SIMPLE) < 0) {
      PyErr_Clear();
      ok = false;
    } else {
      const int64_t* items = static_cast<const int64_t*>(view.buf);
      ok = view.buf == a->ob_item && view.len == 24 && a->ob_exports == 1 && items[0] == 11 && items[2] == 33;
      PyBuffer_Release(&view);
      ok = ok && a->ob_exports == 0;
    }
  }
  Py_DECREF(probe);
  array_layout_ok = ok;
  array_type = reinterpret_cast<PyTypeObject*>(cls);  // kept for the module's life
  return 0;
}

PyObject* collect_impl(PyObject* const* args) {
  PyObject* ctx_tuple = args[0];
  if (!PyTuple_Check(ctx_tuple) || PyTuple_GET_SIZE(ctx_tuple) != CTX_WIDTH) {
    PyErr_SetString(PyExc_TypeError, "optrace collector: bad context");
    return nullptr;
  }
  PyObject* const* ctx = &PyTuple_GET_ITEM(ctx_tuple, 0);
  PyObject *op_args = args[1], *op_kwargs = args[2], *out = args[3], *written_list = args[4];
  Written written;
  if (written_list != Py_None) {
    if (!PyList_Check(written_list)) {
      PyErr_SetString(PyExc_TypeError, "optrace collector: written must be a list of (tensor, is_out) or None");
      return nullptr;
    }
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(written_list); i++) {
      PyObject* pair = PyList_GET_ITEM(written_list, i);
      if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2) {
        PyErr_SetString(PyExc_TypeError, "optrace collector: written must be a list of (tensor, is_out)");
        return nullptr;
      }
      int is_out = PyObject_IsTrue(PyTuple_GET_ITEM(pair, 1));
      if (is_out < 0) {
        return nullptr;
      }
      written.emplace_back(PyTuple_GET_ITEM(pair, 0), is_out != 0);
    }
  }
  Collected c;
  int done = collect_core(ctx, op_args, op_kwargs, out, written_list == Py_None ? nullptr : &written, c);
  if (done <= 0) {
    return done == 0 ? Py_NewRef(Py_None) : nullptr;  // None: the Python path records this op
  }
  PyObject* buffers[6];
  if (side_buffers(args[5], buffers) < 0 || append_sides(buffers, c) < 0) {
    return nullptr;
  }
  PyObject* ins = PyList_New(static_cast<Py_ssize_t>(c.ins.size()));
  PyObject* outs = PyList_New(static_cast<Py_ssize_t>(c.outs.size()));
  PyObject* result = nullptr;
  if (ins != nullptr && outs != nullptr) {
    for (size_t i = 0; i < c.ins.size(); i++) {
      PyList_SET_ITEM(ins, i, Py_NewRef(c.ins[i]));
    }
    for (size_t i = 0; i < c.outs.size(); i++) {
      PyList_SET_ITEM(outs, i, Py_NewRef(c.outs[i]));
    }
    result = Py_BuildValue("(OOLLLL)", ins, outs, static_cast<long long>(c.registered),
                           static_cast<long long>(c.device_key), static_cast<long long>(c.inplace_bytes),
                           static_cast<long long>(c.out_bytes));
  }
  Py_XDECREF(ins);
  Py_XDECREF(outs);
  return result;
}

PyObject* collect(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 6) {
    PyErr_SetString(PyExc_TypeError, "collect(ctx, args, kwargs, out, written, sides) takes 6 arguments");
    return nullptr;
  }
  return collect_impl(args);
}

// extend(buffer, *values): the values appended to an array('q') as int64, what array('q').extend(values)
// does (which parses each item through PyArg_Parse: about 0.1 us an item) at a single copy.
PyObject* extend(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  constexpr Py_ssize_t most = 64;
  if (nargs < 1 || nargs - 1 > most) {
    PyErr_SetString(PyExc_TypeError, "extend(buffer, *values) takes a buffer and at most 64 integers");
    return nullptr;
  }
  int64_t values[most];
  for (Py_ssize_t i = 1; i < nargs; i++) {
    values[i - 1] = PyLong_AsLongLong(args[i]);
    if (values[i - 1] == -1 && PyErr_Occurred()) {
      return nullptr;
    }
  }
  if (append_int64(args[0], values, nargs - 1) < 0) {
    return nullptr;
  }
  Py_RETURN_NONE;
}

PyObject* storage_key(PyObject*, PyObject* o) {
  if (!THPVariable_Check(o)) {
    PyErr_SetString(PyExc_TypeError, "storage_key expects a tensor");
    return nullptr;
  }
  return PyLong_FromVoidPtr(THPVariable_Unpack(o).unsafeGetTensorImpl()->storage().unsafeGetStorageImpl());
}

PyObject* fast_appends(PyObject*, PyObject*) {
  return PyBool_FromLong(array_layout_ok);
}

PyMethodDef methods[] = {
    {"collect", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(collect)), METH_FASTCALL,
     "collect(ctx, args, kwargs, out, written, sides): (inputs, outputs, registered bytes, device key, "
     "in-place bytes, out= bytes) or None"},
    {"extend", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(extend)), METH_FASTCALL,
     "extend(buffer, *values): the values appended to an array('q') as int64"},
    {"storage_key", storage_key, METH_O, "the key of a tensor's storage (its StorageImpl address)"},
    {"fast_appends", fast_appends, METH_NOARGS, "whether appends to array('q') write into its room directly"},
    {nullptr, nullptr, 0, nullptr},
};

PyModuleDef module = {PyModuleDef_HEAD_INIT, "_collector", "optrace's compiled collector and dispatch hook", -1,
                      nullptr};

}  // namespace

int collect_core(PyObject* const* ctx, PyObject* op_args, PyObject* op_kwargs, PyObject* out, const Written* written,
                 Collected& c) {
  if (PyTuple_Check(op_args)) {
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(op_args); i++) {
      if (gather_into(PyTuple_GET_ITEM(op_args, i), c.ins) < 0) {
        return -1;
      }
    }
  }
  if (op_kwargs != nullptr && op_kwargs != Py_None && PyDict_Check(op_kwargs)) {
    Py_ssize_t pos = 0;
    PyObject *k, *v;
    while (PyDict_Next(op_kwargs, &pos, &k, &v)) {
      if (gather_into(v, c.ins) < 0) {
        return -1;
      }
    }
  }
  if (out == Py_None && written != nullptr) {  // returns nothing: its outputs are what it wrote
    for (const auto& pair : *written) {
      c.outs.push_back(pair.first);
    }
  } else if (gather_into(out, c.outs) < 0) {
    return -1;
  }
  size_t n_in = c.ins.size(), n = n_in + c.outs.size();
  for (size_t i = 0; i < n; i++) {
    if (!plain(i < n_in ? c.ins[i] : c.outs[i - n_in])) {
      return 0;  // the Python path records this op
    }
  }

  int failed = 0;
  try {
    for (size_t i = 0; i < n; i++) {
      if (i == n_in) {  // storages first seen as outputs were made by this op
        c.registered = registered_bytes(ctx, &failed);
        if (failed) {
          return -1;
        }
      }
      if (describe(ctx, i < n_in ? c.ins[i] : c.outs[i - n_in], c.sides[i < n_in ? 0 : 1]) < 0) {
        return -1;
      }
    }
    if (n == n_in) {
      c.registered = registered_bytes(ctx, &failed);
      if (failed) {
        return -1;
      }
    }
    if (written != nullptr && written_bytes(ctx, *written, &c.inplace_bytes, &c.out_bytes) < 0) {
      return -1;
    }
    if (n) {
      const c10::Device device = THPVariable_Unpack(n_in ? c.ins[0] : c.outs[0]).device();
      c.device_key = (static_cast<int64_t>(device.type()) << 16) | (static_cast<int64_t>(device.index()) + 1);
    }
  } catch (const std::exception& e) {
    if (!PyErr_Occurred()) {
      PyErr_SetString(PyExc_RuntimeError, e.what());
    }
    return -1;
  }
  return 1;
}

int append_int64(PyObject* array, const int64_t* values, Py_ssize_t n) {
  if (n == 0) {
    return 0;
  }
  if (array_layout_ok && Py_TYPE(array) == array_type) {
    auto* a = reinterpret_cast<ArrayObject*>(array);
    Py_ssize_t size = Py_SIZE(array);
    if (a->ob_exports == 0) {
      if (a->allocated - size < n) {  // grown by doubling (array's own rule adds 1/16: a copy of it every few rows)
        Py_ssize_t room = std::max<Py_ssize_t>({2 * a->allocated, size + n, 1024});
        if (room > PY_SSIZE_T_MAX / static_cast<Py_ssize_t>(sizeof(int64_t))) {
          PyErr_NoMemory();
          return -1;
        }
        // array's items live in the PyMem domain (PyMem_NEW, PyMem_RESIZE, PyMem_Free in Modules/arraymodule.c)
        char* items = static_cast<char*>(PyMem_Realloc(a->ob_item, room * sizeof(int64_t)));
        if (items == nullptr) {
          PyErr_NoMemory();
          return -1;
        }
        a->ob_item = items;
        a->allocated = room;
      }
      std::memcpy(a->ob_item + size * sizeof(int64_t), values, n * sizeof(int64_t));
      Py_SET_SIZE(array, size + n);
      return 0;
    }
  }
  // an exported buffer (frombytes raises BufferError), or not an array
  PyObject* bytes = PyBytes_FromStringAndSize(reinterpret_cast<const char*>(values), n * sizeof(int64_t));
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

// StorageTable.collect (tracer.recording.storage) in C++: the frees the weak references' finaliser noted.
int collect_frees(PyObject* d) {
  PyObject* dead = item(d, s__dead);
  if (dead == nullptr || !PyList_Check(dead)) {
    if (!PyErr_Occurred()) {
      PyErr_SetString(PyExc_TypeError, "optrace collector: StorageTable._dead is not a list");
    }
    return -1;
  }
  Py_ssize_t n = PyList_GET_SIZE(dead);  // others may append meanwhile: only these n are removed below
  if (n == 0) {
    return 0;
  }
  PyObject *refs = item(d, s__refs), *by_cdata = item(d, s__by_cdata), *size = item(d, s_size),
           *hollow = item(d, s_hollow), *freed = item(d, s_freed);
  if (refs == nullptr || by_cdata == nullptr || size == nullptr || hollow == nullptr || freed == nullptr ||
      !PyDict_Check(refs) || !PyDict_Check(by_cdata) || !PyDict_Check(size) || !PySet_Check(hollow) ||
      !PyList_Check(freed)) {
    if (!PyErr_Occurred()) {
      PyErr_SetString(PyExc_TypeError, "optrace collector: a StorageTable without its tables");
    }
    return -1;
  }
  for (Py_ssize_t i = 0; i < n && i < PyList_GET_SIZE(dead); i++) {
    PyObject* ref_id = PyLong_FromVoidPtr(PyList_GET_ITEM(dead, i));  // id(ref)
    if (ref_id == nullptr) {
      return -1;
    }
    PyObject* entry = item(refs, ref_id);
    if (entry == nullptr) {  // already taken, or cleared
      Py_DECREF(ref_id);
      if (PyErr_Occurred()) {
        return -1;
      }
      continue;
    }
    Py_INCREF(entry);
    int rc = PyDict_DelItem(refs, ref_id);
    Py_DECREF(ref_id);
    if (rc < 0 || !PyTuple_Check(entry) || PyTuple_GET_SIZE(entry) != 3) {
      Py_DECREF(entry);
      if (!PyErr_Occurred()) {
        PyErr_SetString(PyExc_TypeError, "optrace collector: a storage's entry is not (ref, key, id)");
      }
      return -1;
    }
    PyObject *key = PyTuple_GET_ITEM(entry, 1), *sid = PyTuple_GET_ITEM(entry, 2);
    PyObject* now = item(by_cdata, key);
    int same = now == nullptr ? 0 : PyObject_RichCompareBool(now, sid, Py_EQ);
    if (same < 0 || (same && PyDict_DelItem(by_cdata, key) < 0) || (now == nullptr && PyErr_Occurred())) {
      Py_DECREF(entry);
      return -1;
    }
    PyObject* bytes = item(size, sid);
    if (bytes == nullptr) {
      if (!PyErr_Occurred()) {
        PyErr_SetObject(PyExc_KeyError, sid);
      }
      Py_DECREF(entry);
      return -1;
    }
    int64_t nbytes = PyLong_AsLongLong(bytes);
    if ((nbytes == -1 && PyErr_Occurred()) || PyDict_DelItem(size, sid) < 0 || add_to(d, s_live_bytes, -nbytes) < 0 ||
        PySet_Discard(hollow, sid) < 0 || PyList_Append(freed, sid) < 0) {
      Py_DECREF(entry);
      return -1;
    }
    Py_DECREF(entry);
  }
  return PyList_SetSlice(dead, 0, n, nullptr);
}

int side_buffers(PyObject* sides, PyObject* buffers[6]) {
  if (!PyTuple_Check(sides) || PyTuple_GET_SIZE(sides) != 2) {
    PyErr_SetString(PyExc_TypeError, "optrace collector: sides must be RowBuffer.sides, two tuples of three arrays");
    return -1;
  }
  for (int s = 0; s < 2; s++) {
    PyObject* side = PyTuple_GET_ITEM(sides, s);
    if (!PyTuple_Check(side) || PyTuple_GET_SIZE(side) != 3) {
      PyErr_SetString(PyExc_TypeError, "optrace collector: sides must be RowBuffer.sides, two tuples of three arrays");
      return -1;
    }
    for (int i = 0; i < 3; i++) {
      buffers[3 * s + i] = PyTuple_GET_ITEM(side, i);
    }
  }
  return 0;
}

int append_sides(PyObject* const buffers[6], const Collected& c) {
  for (int s = 0; s < 2; s++) {
    const Side& side = c.sides[s];
    if (append_int64(buffers[3 * s], side.tensors.data(), static_cast<Py_ssize_t>(side.tensors.size())) < 0 ||
        append_int64(buffers[3 * s + 1], side.sizes.data(), static_cast<Py_ssize_t>(side.sizes.size())) < 0 ||
        append_int64(buffers[3 * s + 2], side.strides.data(), static_cast<Py_ssize_t>(side.strides.size())) < 0) {
      return -1;
    }
  }
  return 0;
}

int truncate(PyObject* array, Py_ssize_t n) {
  return PySequence_Size(array) > n ? PySequence_DelSlice(array, n, PY_SSIZE_T_MAX) : 0;
}

}  // namespace optrace

PyMODINIT_FUNC PyInit__collector(void) {
  using namespace optrace;
  frombytes_name = PyUnicode_InternFromString("frombytes");
  if (check_array_layout() < 0) {
    return nullptr;
  }
  PyObject* m = PyModule_Create(&module);
  if (m == nullptr || PyModule_AddFunctions(m, methods) < 0 || PyModule_AddFunctions(m, dispatch_methods) < 0 ||
      dispatch_init(m) < 0 || PyModule_AddStringConstant(m, "torch_version", OPTRACE_TORCH_VERSION) < 0) {
    Py_XDECREF(m);
    return nullptr;
  }
  return m;
}
