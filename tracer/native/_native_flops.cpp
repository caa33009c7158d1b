// The FLOP counts the compiled dispatch hook (tracer/native/_dispatch.cpp) computes itself: tracer.flops.formulas's
// formulas in NATIVE and tracer.flops.op_kinds's _numel_first and _numel_first_list, with the same arithmetic on
// the same sizes and arguments. Anything the arithmetic here does not read (an argument of another kind, a
// count past int64) is left to the Python count, errors and big ints included.

#include "_dispatch.h"

#include <torch/csrc/autograd/python_variable.h>

#include <initializer_list>
#include <string>
#include <unordered_map>

namespace optrace {
namespace {

int64_t numel_of(PyObject* tensor) {
  return THPVariable_Unpack(tensor).unsafeGetTensorImpl()->numel();
}

// a * b * c * d, or false when it would pass int64
bool product(std::initializer_list<int64_t> factors, int64_t* out) {
  int64_t p = 1;
  for (int64_t f : factors) {
    if (__builtin_mul_overflow(p, f, &p)) {
      return false;
    }
  }
  *out = p;
  return true;
}

}  // namespace

Native native_named(const char* name) {
  static const std::unordered_map<std::string, Native> names = {
      {"mm", MM}, {"addmm", ADDMM}, {"bmm", BMM}, {"baddbmm", BADDBMM}, {"softmax", SOFTMAX},
      {"softmax_backward", SOFTMAX_BACKWARD}, {"layer_norm", LAYER_NORM}, {"layer_norm_backward", LAYER_NORM_BACKWARD},
      {"numel_first", NUMEL_FIRST}, {"numel_first_list", NUMEL_FIRST_LIST}};
  auto found = names.find(name);
  return found != names.end() ? found->second : IN_PYTHON;
}

// The FLOPs of tracer.flops.formulas's formulas in NATIVE and tracer.flops.op_kinds's _numel_first and _numel_first_list,
// from the same sizes and arguments: 1 with *flops set; 0 when the arguments are not what the arithmetic here
// reads or the count passes int64 (the Python count then decides, errors and big ints included).
int native_flops(Native native, PyObject* args, PyObject* kwargs, int64_t* flops) {
  if (!PyTuple_Check(args)) {
    return 0;
  }
  Py_ssize_t n = PyTuple_GET_SIZE(args);
  switch (native) {
    case MM:
    case ADDMM:
    case BMM:
    case BADDBMM: {
      Py_ssize_t first = native == ADDMM || native == BADDBMM ? 1 : 0;  // bias + a @ b
      bool batched = native == BMM || native == BADDBMM;
      if (n < first + 2 || !THPVariable_Check(PyTuple_GET_ITEM(args, first)) ||
          !THPVariable_Check(PyTuple_GET_ITEM(args, first + 1))) {
        return 0;
      }
      c10::IntArrayRef a = THPVariable_Unpack(PyTuple_GET_ITEM(args, first)).sizes();
      c10::IntArrayRef b = THPVariable_Unpack(PyTuple_GET_ITEM(args, first + 1)).sizes();
      if (batched) {  // [b, m, k] @ [b, k, n]: 2 * b * m * k * n
        return a.size() >= 3 && b.size() >= 3 && product({2, a[0], a[1], a[2], b[2]}, flops);
      }
      return a.size() >= 2 && b.size() >= 2 && product({2, a[0], a[1], b[1]}, flops);  // [m, k] @ [k, n]
    }
    case SOFTMAX:  // 5 per element of the input
    case SOFTMAX_BACKWARD:  // 4 per element of the gradient
      return n >= 1 && THPVariable_Check(PyTuple_GET_ITEM(args, 0)) &&
          product({native == SOFTMAX ? 5 : 4, numel_of(PyTuple_GET_ITEM(args, 0))}, flops);
    case LAYER_NORM: {  // (x, normalized_shape, weight, bias, eps): 5 per element, +1 with a weight, +1 with a bias
      if (n < 4 || !THPVariable_Check(PyTuple_GET_ITEM(args, 0))) {
        return 0;
      }
      int64_t per = 5 + (PyTuple_GET_ITEM(args, 2) != Py_None) + (PyTuple_GET_ITEM(args, 3) != Py_None);
      return product({per, numel_of(PyTuple_GET_ITEM(args, 0))}, flops);
    }
    case LAYER_NORM_BACKWARD: {  // (grad_out, x, normalized_shape, mean, rstd, weight, bias, output_mask)
      if (n < 8 || !THPVariable_Check(PyTuple_GET_ITEM(args, 1))) {
        return 0;
      }
      PyObject* mask = PyTuple_GET_ITEM(args, 7);
      if (!(PyList_Check(mask) || PyTuple_Check(mask)) || PySequence_Fast_GET_SIZE(mask) < 2) {
        return 0;
      }
      int wanted[3] = {0, 0, 0};
      Py_ssize_t size = PySequence_Fast_GET_SIZE(mask);
      for (Py_ssize_t i = 0; i < size && i < 3; i++) {
        PyObject* m = PySequence_Fast_GET_ITEM(mask, i);
        if (!PyBool_Check(m)) {  // bool(...) of anything else may run Python: the formula decides
          return 0;
        }
        wanted[i] = m == Py_True;
      }
      // grad_input 9 (+1 with a weight), grad_weight 2, grad_bias 1 per element of x
      int64_t per = (9 + (PyTuple_GET_ITEM(args, 5) != Py_None)) * wanted[0] + 2 * wanted[1] + (size > 2 && wanted[2]);
      return product({per, numel_of(PyTuple_GET_ITEM(args, 1))}, flops);
    }
    case NUMEL_FIRST:
    case NUMEL_FIRST_LIST: {  // the first tensor argument / the first list argument, positional then keyword
      bool list = native == NUMEL_FIRST_LIST;
      // 1: `a` is the argument counted, *flops set; 0: not one; -1: its count passes int64 (Python decides)
      auto take = [&](PyObject* a) -> int {
        if (!(list ? (PyList_Check(a) || PyTuple_Check(a)) : THPVariable_Check(a))) {
          return 0;
        }
        int64_t total = 0;
        if (!list) {
          total = numel_of(a);
        } else {
          for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(a); i++) {
            PyObject* t = PySequence_Fast_GET_ITEM(a, i);
            if (THPVariable_Check(t) && __builtin_add_overflow(total, numel_of(t), &total)) {
              return -1;
            }
          }
        }
        *flops = total;
        return 1;
      };
      for (Py_ssize_t i = 0; i < n; i++) {
        if (int taken = take(PyTuple_GET_ITEM(args, i))) {
          return taken > 0;
        }
      }
      if (kwargs != nullptr && PyDict_Check(kwargs)) {
        Py_ssize_t pos = 0;
        PyObject *k, *v;
        while (PyDict_Next(kwargs, &pos, &k, &v)) {
          if (int taken = take(v)) {
            return taken > 0;
          }
        }
      }
      *flops = 0;  // no such argument: 0
      return 1;
    }
    default:
      return 0;
  }
}

}  // namespace optrace
