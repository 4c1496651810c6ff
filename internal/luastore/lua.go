package luastore

/*
#cgo pkg-config: lua5.1
#include <stdlib.h>
#include "luastore.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"runtime/cgo"
	"strings"
	"sync"
	"unsafe"

	"github.com/alicebob/miniredis/v2/server"
)

// state is one Lua 5.1 state, the interpreter Redis embeds.
type state struct {
	l     *C.lua_State
	store cgo.Handle
	data  []byte     // strings laid end to end, on their way into Lua
	lens  []C.size_t // their lengths
}

// chunk is a compiled function kept in the state's registry.
type chunk C.int

func newState(s *Store) (*state, error) {
	h := cgo.NewHandle(s)
	l := C.luastore_open(C.uintptr_t(h))
	if l == nil {
		h.Delete()
		return nil, errors.New("luastore: no memory for a Lua state")
	}
	return &state{l: l, store: h}, nil
}

func (st *state) close() {
	C.luastore_close(st.l)
	st.store.Delete()
}

// compile compiles code named name (a Lua chunk name: "@user_script").
func (st *state) compile(code, name string) (chunk, error) {
	defer C.lua_settop(st.l, 0) // an error's message
	if strings.HasPrefix(code, "\x1b") {
		return 0, errors.New("bytecode is not accepted") // as Redis (CVE-2015-4335)
	}
	text := code // or its bytecode, compiled before
	b, cached := bytecode.Load(code)
	if cached {
		text = b.(string)
	}
	cname := C.CString(name)
	defer C.free(unsafe.Pointer(cname))
	if C.luastore_load(st.l, cstr(text), C.size_t(len(text)), cname) != 0 {
		return 0, errors.New(st.errorMessage())
	}
	if !cached {
		var n C.size_t
		dump := C.luastore_dump(st.l, &n)
		bytecode.Store(code, C.GoStringN(dump, C.int(n)))
		C.free(unsafe.Pointer(dump))
	}
	return chunk(C.luaL_ref(st.l, C.LUA_REGISTRYINDEX)), nil
}

// bytecode keeps each source text's compiled code for the process, which
// loads without parsing: the simulator's restarts load the same library
// thousands of times. It is never emptied: its texts are the service's few
// scripts and library, not a client's arbitrary EVALs.
var bytecode sync.Map // source text -> its bytecode (a string)

func (st *state) forget(c chunk) {
	C.luaL_unref(st.l, C.LUA_REGISTRYINDEX, C.int(c))
}

// cstr points at s's bytes, which C reads and does not keep.
func cstr(s string) *C.char {
	if len(s) == 0 {
		return nil
	}
	return (*C.char)(unsafe.Pointer(unsafe.StringData(s)))
}

func (st *state) pushStrings(v []string) {
	st.data, st.lens = st.data[:0], st.lens[:0]
	for _, s := range v {
		st.data = append(st.data, s...)
		st.lens = append(st.lens, C.size_t(len(s)))
	}
	var data *C.char
	var lens *C.size_t
	if len(v) > 0 {
		lens = &st.lens[0]
		if len(st.data) > 0 {
			data = (*C.char)(unsafe.Pointer(&st.data[0]))
		}
	}
	C.luastore_push_strings(st.l, data, lens, C.int(len(v)))
}

// setGlobals sets KEYS and ARGV, as EVAL does.
func (st *state) setGlobals(keys, argv []string) {
	st.pushStrings(keys)
	C.luastore_set_global(st.l, keysName)
	st.pushStrings(argv)
	C.luastore_set_global(st.l, argvName)
}

var keysName, argvName = C.CString("KEYS"), C.CString("ARGV")

// call calls c with args, each a table of strings (FCALL's keys and
// arguments), and answers its reply, or its error, to p.
func (st *state) call(p *server.Peer, c chunk, args ...[]string) {
	defer C.lua_settop(st.l, 0)
	C.luastore_push_ref(st.l, C.int(c))
	for _, a := range args {
		st.pushStrings(a)
	}
	if C.lua_pcall(st.l, C.int(len(args)), 1, 0) != 0 {
		p.WriteError(st.errorMessage())
		return
	}
	var n C.size_t
	reply := C.luastore_reply(st.l, boolInt(p.Resp3), &n)
	p.WriteRaw(C.GoStringN(reply, C.int(n)))
	C.free(unsafe.Pointer(reply))
}

// run calls c for its effects (a library's code, which registers its
// functions).
func (st *state) run(c chunk) error {
	defer C.lua_settop(st.l, 0)
	C.luastore_push_ref(st.l, C.int(c))
	if C.lua_pcall(st.l, 0, 0, 0) != 0 {
		return errors.New(st.errorMessage())
	}
	return nil
}

func (st *state) errorMessage() string {
	var n C.size_t
	m := C.luastore_error(st.l, &n)
	return C.GoStringN(m, C.int(n))
}

func boolInt(b bool) C.int {
	if b {
		return 1
	}
	return 0
}

// fail leaves message on l's stack for C to raise.
func fail(l *C.lua_State, message string) C.int {
	C.lua_pushlstring(l, cstr(message), C.size_t(len(message)))
	return -1
}

//export luastoreCall
func luastoreCall(l *C.lua_State, h C.uintptr_t, n C.int, ptrs **C.char, lens *C.size_t, raise C.int) (ret C.int) {
	defer recoverInto(l, &ret)
	s := cgo.Handle(h).Value().(*Store)
	if s.loading != nil {
		return fail(l, "redis.call is not allowed while a function library loads")
	}
	ps, ls := unsafe.Slice(ptrs, int(n)), unsafe.Slice(lens, int(n))
	args := make([]string, n)
	for i := range args {
		args[i] = C.GoStringN(ps[i], C.int(ls[i]))
	}
	reply, err := s.dispatch(args)
	if err != nil {
		if raise != 0 {
			return fail(l, err.Error())
		}
		C.luastore_push_field(l, errName, cstr(err.Error()), C.size_t(len(err.Error())))
		return 1
	}
	return C.luastore_push_reply(l, (*C.char)(unsafe.Pointer(unsafe.SliceData(reply))), C.size_t(len(reply)), raise)
}

var errName = C.CString("err")

//export luastoreRegister
func luastoreRegister(l *C.lua_State, h C.uintptr_t, cname *C.char, n C.size_t) (ret C.int) {
	defer recoverInto(l, &ret)
	s := cgo.Handle(h).Value().(*Store)
	if s.loading == nil {
		return fail(l, "redis.register_function can only be called while a function library loads")
	}
	name := C.GoStringN(cname, C.int(n))
	if _, dup := s.loading[name]; dup {
		return fail(l, "Function already exists in the library")
	}
	s.loading[name] = chunk(C.luaL_ref(l, C.LUA_REGISTRYINDEX)) // the callback, on top
	return 0
}

// recoverInto turns a panic of an exported function into a Lua error: a
// panic must not unwind through Lua's C frames.
func recoverInto(l *C.lua_State, ret *C.int) {
	if p := recover(); p != nil {
		*ret = fail(l, fmt.Sprintf("luastore: %v", p))
	}
}
