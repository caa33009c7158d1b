"""Storage identity and lifetime.

Each storage the tracer sees gets a small integer id, never reused within a
trace. Identity comes from the `UntypedStorage` object (its `_cdata` pointer,
which PyTorch keeps tied to one Python object for the storage's whole life), so
it works on real, meta and fake tensors alike; `data_ptr()` would not (meta and
fake storages have no data, and CUDA caching allocators reuse addresses).

A weak reference with a callback on the storage object tells us when the
storage is freed, which keeps `live_bytes` honest without keeping anything
alive. The callback is a bound `list.append`: C code that runs no Python bytecode,
so a Ctrl-C (a KeyboardInterrupt, raised only between bytecodes) can never arrive
inside it and be printed as "Exception ignored" while the program goes on. The
frees it notes are taken into account on the traced thread (`collect`), before the
next op's storages are looked up.
"""

import weakref


class StorageTable:
    """Ids, sizes and live bytes of every storage seen in one trace."""

    def __init__(self):
        self._by_cdata = {}  # storage._cdata -> id, for live storages only
        self._refs = {}  # id(weakref) -> (weakref, _cdata, storage id), for live storages
        self.size = {}  # storage id -> bytes, for live storages
        self.live_bytes = 0
        self.registered_bytes = 0  # bytes of every storage ever registered: differences give an op's allocation
        self.freed = []  # ids freed since the dispatch hook last took this list
        self._dead = []  # weak references whose storage died, not yet collected (appended by the finaliser)
        self._note_free = self._dead.append  # the finaliser: C code only (see the module docstring)
        self.hollow = set()  # ids whose size was overridden (wrapper subclasses): never regrown
        self.next_id = 0
        self.on_resize = None  # on_resize(id, bytes): a known storage changed size in place (tracer.recording.metadata)

    def id_of(self, storage):
        """The storage's id; a storage seen for the first time gets the next id
        and counts as live."""
        if self._dead:
            self.collect()
        sid = self._by_cdata.get(storage._cdata)
        return self.register(storage) if sid is None else sid

    def opaque(self):
        """A fresh id for a tensor whose storage cannot be read (an mkldnn tensor): it holds no bytes
        optrace can see, and no later row names it again."""
        sid = self.next_id
        self.next_id = sid + 1
        return sid

    def register(self, storage, nbytes=None):
        """Give an unseen storage its id; `nbytes` overrides its size (0 for a wrapper's)."""
        key = storage._cdata
        sid = self.next_id
        self.next_id = sid + 1
        size = storage.nbytes() if nbytes is None else nbytes
        if nbytes is not None:
            self.hollow.add(sid)
        self._by_cdata[key] = sid
        self.size[sid] = size
        self.live_bytes += size
        self.registered_bytes += size
        ref = weakref.ref(storage, self._note_free)
        self._refs[id(ref)] = (ref, key, sid)
        return sid

    def regrow(self, storage):
        """Account for a known storage that an op resized in place (resize_, out= into a
        smaller tensor); the growth counts as registered, like a new storage."""
        sid = self._by_cdata.get(storage._cdata)
        if sid is None or sid in self.hollow:
            return
        size = storage.nbytes()
        grown = size - self.size[sid]
        if grown:
            self.size[sid] = size
            self.live_bytes += grown
            self.registered_bytes += grown
            if self.on_resize is not None:
                self.on_resize(sid, size)

    def known(self, storage):
        """The id of a storage already seen, or None; never registers it."""
        if self._dead:
            self.collect()
        return self._by_cdata.get(storage._cdata)

    def collect(self):
        """Take the frees the finaliser noted into account: forget their storages, lower
        `live_bytes`, list their ids in `freed`. Runs on the traced thread; idempotent per
        reference, so a KeyboardInterrupt in the middle loses nothing (the rest is taken next time)."""
        dead = self._dead
        n = len(dead)  # other threads may append meanwhile: only these n are removed below
        for ref in dead[:n]:
            entry = self._refs.pop(id(ref), None)
            if entry is None:  # already taken, or cleared
                continue
            _, key, sid = entry
            if self._by_cdata.get(key) == sid:
                del self._by_cdata[key]
            self.live_bytes -= self.size.pop(sid)
            self.hollow.discard(sid)  # ids are never reused: what is kept per id goes with the storage
            self.freed.append(sid)
        del dead[:n]

    def clear(self):
        """Forget every storage; later frees no longer call back (`live_bytes` keeps the
        frees noted so far)."""
        self.collect()
        self._by_cdata.clear()
        self._refs.clear()  # the references die with this dict: their finaliser no longer runs
        self._dead.clear()
        self.size.clear()
