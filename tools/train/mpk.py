# SPDX-License-Identifier: MIT
"""ctypes bindings to the few libmoepager calls the training side needs (writer, reader).

The .mpk file is written by the project's C writer, never by Python.
"""
import ctypes
import os

MP_DTYPE = {"f32": 0, "f16": 1, "bf16": 2}


class Geometry(ctypes.Structure):
    _fields_ = [(n, ctypes.c_uint32) for n in
                ("layers", "experts", "topk", "hidden", "ffn", "heads", "kv_heads",
                 "head_dim", "vocab", "max_seq")] + [
        ("dtype", ctypes.c_int), ("rope_theta", ctypes.c_float), ("norm_eps", ctypes.c_float)]


class TensorInfo(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char * 64), ("dtype", ctypes.c_int), ("ndim", ctypes.c_uint32),
                ("dims", ctypes.c_uint64 * 4), ("offset", ctypes.c_uint64),
                ("bytes", ctypes.c_uint64), ("checksum", ctypes.c_uint64)]


def default_lib():
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(os.path.dirname(here))
    for d in ("build-train", "build"):
        p = os.path.join(root, d, "libmoepager.so")
        if os.path.exists(p):
            return p
    raise FileNotFoundError("libmoepager.so: build the project first (meson setup build-train)")


class Lib:
    def __init__(self, path=None):
        self.so = ctypes.CDLL(path or default_lib())
        so = self.so
        so.mp_last_error.restype = ctypes.c_char_p
        so.mp_store_writer_create.argtypes = [ctypes.c_char_p, ctypes.POINTER(Geometry),
                                              ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p)]
        so.mp_store_writer_tensor_count.argtypes = [ctypes.c_void_p]
        so.mp_store_writer_tensor_count.restype = ctypes.c_uint32
        so.mp_store_writer_tensor_at.argtypes = [ctypes.c_void_p, ctypes.c_uint32]
        so.mp_store_writer_tensor_at.restype = ctypes.POINTER(TensorInfo)
        so.mp_store_writer_put_tensor.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
        so.mp_store_writer_put_expert.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_uint32,
                                                  ctypes.c_void_p]
        so.mp_store_writer_finish.argtypes = [ctypes.c_void_p]
        so.mp_store_writer_abort.argtypes = [ctypes.c_void_p]
        so.mp_dtype_from_f32.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]
        so.mp_dtype_to_f32.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]
        so.mp_dtype_size.argtypes = [ctypes.c_int]
        so.mp_dtype_size.restype = ctypes.c_size_t

    def check(self, err, what):
        if err < 0:
            raise OSError(-err, "%s: %s" % (what, self.so.mp_last_error().decode()))
        return err

    def convert(self, arr_f32, dtype):
        """f32 numpy array -> bytes of dtype, converted by the library's own rounding."""
        import numpy as np
        a = np.ascontiguousarray(arr_f32, dtype=np.float32)
        t = MP_DTYPE[dtype]
        out = ctypes.create_string_buffer(a.size * self.so.mp_dtype_size(t))
        self.so.mp_dtype_from_f32(t, a.ctypes.data, out, a.size)
        return out

    def round_trip(self, arr_f32, dtype):
        """The f32 values the engine sees after storing arr_f32 as dtype."""
        import numpy as np
        buf = self.convert(arr_f32, dtype)
        out = np.empty(arr_f32.shape, dtype=np.float32)
        self.so.mp_dtype_to_f32(MP_DTYPE[dtype], buf, out.ctypes.data, out.size)
        return out


class Writer:
    def __init__(self, lib, path, geom, name):
        self.lib = lib
        self.w = ctypes.c_void_p()
        lib.check(lib.so.mp_store_writer_create(path.encode(), ctypes.byref(geom), name.encode(),
                                                ctypes.byref(self.w)), "writer create " + path)

    def tensors(self):
        so = self.lib.so
        out = []
        for i in range(so.mp_store_writer_tensor_count(self.w)):
            t = so.mp_store_writer_tensor_at(self.w, i).contents
            out.append((t.name.decode(), t.dtype, tuple(t.dims[:t.ndim]), t.bytes))
        return out

    def put_tensor(self, name, buf):
        self.lib.check(self.lib.so.mp_store_writer_put_tensor(self.w, name.encode(), buf), name)

    def put_expert(self, layer, expert, buf):
        self.lib.check(self.lib.so.mp_store_writer_put_expert(self.w, layer, expert, buf),
                       "expert %d/%d" % (layer, expert))

    def finish(self):
        w, self.w = self.w, None
        self.lib.check(self.lib.so.mp_store_writer_finish(w), "writer finish")

    def abort(self):
        if self.w:
            self.lib.so.mp_store_writer_abort(self.w)
            self.w = None
