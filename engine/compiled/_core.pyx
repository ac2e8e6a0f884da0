# cython: language_level=3, boundscheck=False, wraparound=False
# distutils: language = c++
"""kvsim's compiled core: thin Python bindings over the C++ classes in csrc/.

Nothing here decides anything: every rule lives in the C++ headers, so that a compiled
scheduler can call them without Python in between. See docs/compiled.md.
"""

from libc.stdint cimport int8_t, int32_t, int64_t, uint64_t
from libc.stdlib cimport free as c_free
from libcpp cimport bool as cbool
from libcpp.string cimport string
from libcpp.vector cimport vector
from cython.view cimport array as cvarray

import numpy as np

include "_decls.pxi"
include "_arrays.pxi"
include "_trackers.pxi"
include "_pool.pxi"
include "_v1core.pxi"
include "_classic.pxi"
include "_explode.pxi"
include "_offload.pxi"
include "_open_loop.pxi"
include "_offload_core.pxi"
