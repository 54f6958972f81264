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


class ExpertInfo(ctypes.Structure):
    _fields_ = [("layer", ctypes.c_uint32), ("expert", ctypes.c_uint32),
                ("offset", ctypes.c_uint64), ("bytes", ctypes.c_uint64),
                ("checksum", ctypes.c_uint64)]


class Reader:
    """An .mpk opened by the library's reader: geometry, tensors and experts as f32 numpy."""

    def __init__(self, lib, path):
        so = lib.so
        so.mp_store_open.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p)]
        so.mp_store_close.argtypes = [ctypes.c_void_p]
        so.mp_store_geometry.argtypes = [ctypes.c_void_p]
        so.mp_store_geometry.restype = ctypes.POINTER(Geometry)
        so.mp_store_name.argtypes = [ctypes.c_void_p]
        so.mp_store_name.restype = ctypes.c_char_p
        so.mp_store_tensor_count.argtypes = [ctypes.c_void_p]
        so.mp_store_tensor_count.restype = ctypes.c_uint32
        so.mp_store_tensor_at.argtypes = [ctypes.c_void_p, ctypes.c_uint32]
        so.mp_store_tensor_at.restype = ctypes.POINTER(TensorInfo)
        so.mp_store_read_tensor.argtypes = [ctypes.c_void_p, ctypes.POINTER(TensorInfo),
                                            ctypes.c_void_p]
        so.mp_store_expert.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_uint32]
        so.mp_store_expert.restype = ctypes.POINTER(ExpertInfo)
        so.mp_store_read_expert.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_uint32,
                                            ctypes.c_void_p]
        self.lib = lib
        self.s = ctypes.c_void_p()
        lib.check(so.mp_store_open(path.encode(), ctypes.byref(self.s)), "open " + path)
        g = so.mp_store_geometry(self.s).contents
        self.geom = Geometry()
        ctypes.pointer(self.geom)[0] = g
        self.name = so.mp_store_name(self.s).decode()

    def close(self):
        if self.s:
            self.lib.so.mp_store_close(self.s)
            self.s = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _to_f32(self, dtype, buf, shape):
        import numpy as np
        out = np.empty(shape, dtype=np.float32)
        self.lib.so.mp_dtype_to_f32(dtype, buf, out.ctypes.data, out.size)
        return out

    def tensors(self):
        """{name: f32 array} of every non-expert tensor."""
        so = self.lib.so
        out = {}
        for i in range(so.mp_store_tensor_count(self.s)):
            t = so.mp_store_tensor_at(self.s, i)
            info = t.contents
            buf = ctypes.create_string_buffer(info.bytes)
            name = info.name.decode()
            self.lib.check(so.mp_store_read_tensor(self.s, t, buf), name)
            out[name] = self._to_f32(info.dtype, buf, tuple(info.dims[:info.ndim]))
        return out

    def expert(self, layer, expert):
        """(gate, up, down) of one expert as f32 arrays, and the checksum of its stored bytes."""
        so, g = self.lib.so, self.geom
        info = so.mp_store_expert(self.s, layer, expert).contents
        buf = ctypes.create_string_buffer(info.bytes)
        self.lib.check(so.mp_store_read_expert(self.s, layer, expert, buf),
                       "expert %d/%d" % (layer, expert))
        n = g.ffn * g.hidden
        a = self._to_f32(g.dtype, buf, (3 * n,))
        return ((a[:n].reshape(g.ffn, g.hidden), a[n:2 * n].reshape(g.ffn, g.hidden),
                 a[2 * n:].reshape(g.hidden, g.ffn)), info.checksum)


class Tokenizer:
    """engine/tokenizer.c over a vocabulary file (the committed MODEL.tok)."""

    def __init__(self, lib, path):
        so = lib.so
        so.mp_tokenizer_open.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p)]
        so.mp_tokenizer_close.argtypes = [ctypes.c_void_p]
        for f in ("mp_tokenizer_vocab", "mp_tokenizer_bos", "mp_tokenizer_eos"):
            getattr(so, f).argtypes = [ctypes.c_void_p]
            getattr(so, f).restype = ctypes.c_uint32
        so.mp_tokenizer_encode.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t,
                                           ctypes.c_void_p, ctypes.c_size_t]
        self.lib = lib
        self.t = ctypes.c_void_p()
        lib.check(so.mp_tokenizer_open(path.encode(), ctypes.byref(self.t)), "open " + path)
        self.vocab = so.mp_tokenizer_vocab(self.t)
        self.bos = so.mp_tokenizer_bos(self.t)
        self.eos = so.mp_tokenizer_eos(self.t)

    def encode(self, text):
        import numpy as np
        b = text.encode("utf-8")
        cap = len(b) + 16
        while True:
            ids = np.empty(cap, dtype=np.uint32)
            n = self.lib.check(self.lib.so.mp_tokenizer_encode(self.t, b, len(b), ids.ctypes.data,
                                                               cap), "encode")
            if n <= cap:
                return ids[:n]
            cap = n

    def close(self):
        if self.t:
            self.lib.so.mp_tokenizer_close(self.t)
            self.t = None
