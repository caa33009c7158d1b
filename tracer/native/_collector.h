// What tracer/native/_collector.cpp (reading an op's tensors) and tracer/native/_dispatch.cpp (the dispatch hook in C++)
// share. Both are compiled into one module, `tracer.native._collector`, by tracer.native.build_ext.
#pragma once

#include <Python.h>

#include <cstdint>
#include <utility>
#include <vector>

namespace optrace {

// ctx (tracer.recording.start builds it): the StorageTable's storage key -> id, id -> bytes, weak
// references and their finaliser, hollow ids and regrow(storage); the tracer's dtype -> dtype id
// and new_dtype(dtype) -> dtype id; the StorageTable itself (next_id, live_bytes, registered_bytes).
enum { BY_CDATA, SIZE, REFS, NOTE_FREE, HOLLOW, REGROW, DTYPE_IDS, NEW_DTYPE, STORAGES, CTX_WIDTH };

// (tensor, written as an out= argument) for each tensor an op writes into
using Written = std::vector<std::pair<PyObject*, bool>>;

// One side of an op's tensors (its inputs, or its outputs) as the row buffers take them (tracer.store.writer
// RowBuffer.sides): per tensor, ndim, dtype id, storage id and storage bytes in `tensors`, its sizes in `sizes`
// and its strides in `strides`.
struct Side {
  std::vector<int64_t> tensors, sizes, strides;

  void clear() {
    tensors.clear();
    sizes.clear();
    strides.clear();
  }
};

// One op's tensors: its inputs' side, then its outputs'.
struct Collected {
  std::vector<PyObject*> ins, outs;  // borrowed from the op's arguments and result
  Side sides[2];
  int64_t registered = 0;  // StorageTable.registered_bytes after the inputs: what the outputs add is the op's allocation
  int64_t device_key = -1;  // (device type << 16) | (index + 1) of the first tensor; -1 without tensors
  int64_t inplace_bytes = 0, out_bytes = 0;

  void clear() {  // for reuse: the vectors keep their room
    ins.clear();
    outs.clear();
    sides[0].clear();
    sides[1].clear();
    registered = inplace_bytes = out_bytes = 0;
    device_key = -1;
  }
};

// Reads an op's tensor arguments (one level into lists) and outputs (what it wrote, when it returns
// nothing), registering storages seen for the first time. 1: done; 0: a tensor only the Python path
// reads (a subclass other than Parameter, sparse, nested, symbolic sizes), nothing changed; -1: a
// Python error is set.
int collect_core(PyObject* const* ctx, PyObject* args, PyObject* kwargs, PyObject* out, const Written* written,
                 Collected& c);

// StorageTable.registered_bytes; *failed set (and a Python error) when it cannot be read.
int64_t registered_bytes(PyObject* const* ctx, int* failed);

// Appends int64 values to an `array('q')`, in place when it has room (see _collector.cpp).
int append_int64(PyObject* array, const int64_t* values, Py_ssize_t n);

// RowBuffer.sides, ((in_tensors, in_sizes, in_strides), (out_tensors, out_sizes, out_strides)), as its six
// arrays in that order; -1 with an error set when `sides` is not that.
int side_buffers(PyObject* sides, PyObject* buffers[6]);
// Appends both sides of `c` to the six arrays side_buffers found.
int append_sides(PyObject* const buffers[6], const Collected& c);
// Cuts an `array('q')` back to its first n items.
int truncate(PyObject* array, Py_ssize_t n);

// The dispatch hook's functions, added to the module by PyInit__collector.
extern PyMethodDef dispatch_methods[];
int dispatch_init(PyObject* module);

}  // namespace optrace
