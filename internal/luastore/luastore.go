// Package luastore runs Lua on a miniredis the way Redis does: a script or
// a function library is compiled once, on SCRIPT LOAD, EVAL or FUNCTION
// LOAD, and kept in one Lua state with its globals protected; each EVALSHA
// runs the compiled chunk, each FCALL calls the registered function, whose
// library keeps its locals between calls. miniredis itself builds a Lua
// state and runs the whole script text on every call, which is most of the
// simulator's time. It is for tests and the simulator only: it speaks to
// database 0, with no MULTI around its commands and no read-only scripts.
package luastore

import (
	"bufio"
	"bytes"
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/alicebob/miniredis/v2"
	"github.com/alicebob/miniredis/v2/server"
	lua "github.com/yuin/gopher-lua"
	"github.com/yuin/gopher-lua/parse"
)

// Store is the Lua of one miniredis.
type Store struct {
	m *miniredis.Miniredis
	l *lua.LState
	// nested is miniredis's context of a command a script calls: it
	// runs without taking the server's lock, which the script holds.
	nested    any
	scripts   map[string]*lua.LFunction // by SHA1
	functions map[string]*lua.LFunction // by name
	libraries map[string][]string       // a library's functions
	loading   map[string]*lua.LFunction // what a FUNCTION LOAD registers; nil outside one
	reply     bytes.Buffer              // a called command's reply
	replyW    *bufio.Writer             // into reply
	replyR    *bufio.Reader             // from reply
}

// ctxCommand is the command Install calls from one of miniredis's own
// scripts to learn the context of a script's commands.
const ctxCommand = "LUASTORE.CONTEXT"

// Install makes m's scripts and functions run on a Store.
func Install(m *miniredis.Miniredis) (*Store, error) {
	s := &Store{m: m}
	s.replyW, s.replyR = bufio.NewWriter(&s.reply), bufio.NewReader(&s.reply)
	err := m.Server().Register(ctxCommand, func(c *server.Peer, _ string, _ []string) {
		s.nested = c.Ctx
		c.WriteOK()
	})
	if err != nil {
		return nil, err
	}
	var out bytes.Buffer
	w := bufio.NewWriter(&out)
	m.Server().Dispatch(server.NewPeer(w), []string{"EVAL", "return redis.call('" + ctxCommand + "')", "0"})
	_ = w.Flush() // into a bytes.Buffer, which takes everything
	if s.nested == nil {
		return nil, fmt.Errorf("luastore: no script context from miniredis: %q", out.String())
	}
	s.l = s.newState()
	s.Flush()
	m.Server().SetPreHook(s.hook)
	return s, nil
}

// Flush forgets every script and function library, as a restart of Redis
// does.
func (s *Store) Flush() {
	s.m.Lock()
	defer s.m.Unlock()
	s.scripts = map[string]*lua.LFunction{}
	s.functions = map[string]*lua.LFunction{}
	s.libraries = map[string][]string{}
}

func (s *Store) newState() *lua.LState {
	l := lua.NewState(lua.Options{SkipOpenLibs: true})
	for name, open := range map[string]lua.LGFunction{
		lua.BaseLibName: lua.OpenBase, lua.TabLibName: lua.OpenTable,
		lua.StringLibName: lua.OpenString, lua.MathLibName: lua.OpenMath,
	} {
		l.Push(l.NewFunction(open))
		l.Push(lua.LString(name))
		l.Call(1, 0)
	}
	r := l.NewTable()
	r.RawSetString("call", l.NewFunction(func(l *lua.LState) int { return s.call(l, true) }))
	r.RawSetString("pcall", l.NewFunction(func(l *lua.LState) int { return s.call(l, false) }))
	for fn, name := range map[string]string{"error_reply": "err", "status_reply": "ok"} {
		r.RawSetString(fn, l.NewFunction(func(l *lua.LState) int {
			l.Push(field(l, name, l.CheckString(1)))
			return 1
		}))
	}
	r.RawSetString("register_function", l.NewFunction(s.register))
	l.SetGlobal("redis", r)
	l.SetGlobal("server", r)
	// Redis refuses a script's global writes and reads of undefined
	// globals: a state kept between calls must not carry a call's leftovers.
	mt := l.NewTable()
	mt.RawSetString("__newindex", l.NewFunction(func(l *lua.LState) int {
		l.RaiseError("Attempt to modify a readonly table: %s", l.ToString(2))
		return 0
	}))
	mt.RawSetString("__index", l.NewFunction(func(l *lua.LState) int {
		l.RaiseError("Script attempted to access nonexistent global variable '%s'", l.ToString(2))
		return 0
	}))
	l.SetMetatable(l.G.Global, mt)
	return l
}

func field(l *lua.LState, name, value string) *lua.LTable {
	t := l.NewTable()
	t.RawSetString(name, lua.LString(value))
	return t
}

// hook answers the scripting commands; the others go on to miniredis.
func (s *Store) hook(c *server.Peer, cmd string, args ...string) bool {
	switch cmd {
	case "EVAL", "EVALSHA", "FCALL", "SCRIPT", "FUNCTION":
	default:
		return false
	}
	s.m.Lock()
	defer s.m.Unlock()
	if cmd != "SCRIPT" && cmd != "FUNCTION" && len(args) < 2 {
		c.WriteError("ERR wrong number of arguments for '" + strings.ToLower(cmd) + "' command")
		return true
	}
	switch cmd {
	case "EVAL":
		fn, err := s.compile(args[0])
		if err != nil {
			c.WriteError(err.Error())
			return true
		}
		s.eval(c, fn, args[1:])
	case "EVALSHA":
		fn, ok := s.scripts[strings.ToLower(args[0])]
		if !ok {
			c.WriteError("NOSCRIPT No matching script. Please use EVAL.")
			return true
		}
		s.eval(c, fn, args[1:])
	case "FCALL":
		fn, ok := s.functions[args[0]]
		if !ok {
			c.WriteError("ERR Function not found")
			return true
		}
		keys, argv, err := split(args[1:])
		if err != nil {
			c.WriteError(err.Error())
			return true
		}
		s.run(c, fn, s.strings(keys), s.strings(argv))
	case "SCRIPT":
		s.script(c, args)
	case "FUNCTION":
		s.function(c, args)
	}
	return true
}

// split parses "numkeys key... arg...".
func split(args []string) (keys, argv []string, err error) {
	n, err := strconv.Atoi(args[0])
	if err != nil || n < 0 {
		return nil, nil, errors.New("ERR value is not an integer or out of range")
	}
	if n > len(args)-1 {
		return nil, nil, errors.New("ERR Number of keys can't be greater than number of args")
	}
	return args[1 : 1+n], args[1+n:], nil
}

func (s *Store) strings(v []string) *lua.LTable {
	t := s.l.CreateTable(len(v), 0)
	for i, x := range v {
		t.RawSetInt(i+1, lua.LString(x))
	}
	return t
}

// compile keeps script's chunk, a function Redis would name f_<sha>.
func (s *Store) compile(script string) (*lua.LFunction, error) {
	sum := sha1.Sum([]byte(script))
	sha := hex.EncodeToString(sum[:])
	if fn, ok := s.scripts[sha]; ok {
		return fn, nil
	}
	proto, err := compiled(script)
	if err != nil {
		return nil, fmt.Errorf("ERR Error compiling script (new function): %w", err)
	}
	fn := s.l.NewFunctionFromProto(proto)
	s.scripts[sha] = fn
	return fn, nil
}

// protos keeps each source text's compiled code for the process: the
// simulator's restarts load the same library thousands of times, and a
// compiled chunk is shared between Lua states as it is read-only. It is
// never emptied: its texts are the service's few scripts and library, not
// a client's arbitrary EVALs.
var protos sync.Map // source text -> *lua.FunctionProto

func compiled(source string) (*lua.FunctionProto, error) {
	if p, ok := protos.Load(source); ok {
		return p.(*lua.FunctionProto), nil
	}
	chunk, err := parse.Parse(strings.NewReader(source), "<string>")
	if err != nil {
		return nil, err
	}
	p, err := lua.Compile(chunk, "<string>")
	if err != nil {
		return nil, err
	}
	protos.Store(source, p)
	return p, nil
}

// eval runs a script's chunk with its KEYS and ARGV.
func (s *Store) eval(c *server.Peer, fn *lua.LFunction, args []string) {
	keys, argv, err := split(args)
	if err != nil {
		c.WriteError(err.Error())
		return
	}
	s.l.G.Global.RawSetString("KEYS", s.strings(keys))
	s.l.G.Global.RawSetString("ARGV", s.strings(argv))
	s.run(c, fn)
}

func (s *Store) run(c *server.Peer, fn *lua.LFunction, args ...lua.LValue) {
	defer s.l.SetTop(0)
	if err := s.l.CallByParam(lua.P{Fn: fn, NRet: 1, Protect: true}, args...); err != nil {
		c.WriteError(err.Error())
		return
	}
	write(c, s.l.Get(-1))
}

// write answers v as Redis converts a Lua value to its reply.
func write(c *server.Peer, v lua.LValue) {
	switch v := v.(type) {
	case lua.LBool:
		if v {
			c.WriteInt(1)
		} else {
			c.WriteNull()
		}
	case lua.LNumber:
		c.WriteInt(int(v))
	case lua.LString:
		c.WriteBulk(string(v))
	case *lua.LTable:
		if e := v.RawGetString("err"); e != lua.LNil {
			c.WriteError(e.String())
			return
		}
		if ok := v.RawGetString("ok"); ok != lua.LNil {
			c.WriteInline(ok.String())
			return
		}
		n := 0
		for v.RawGetInt(n+1) != lua.LNil {
			n++
		}
		c.WriteLen(n)
		for i := 1; i <= n; i++ {
			write(c, v.RawGetInt(i))
		}
	default:
		c.WriteNull()
	}
}

// call is redis.call (raise) and redis.pcall (raise: false): a command run
// on miniredis within the script's lock, its reply as a Lua value.
func (s *Store) call(l *lua.LState, raise bool) int {
	if s.loading != nil {
		l.RaiseError("redis.call is not allowed while a function library loads")
	}
	top := l.GetTop()
	if top == 0 {
		l.RaiseError("Please specify at least one argument for this redis lib call")
	}
	args := make([]string, top)
	for i := range top {
		switch a := l.Get(i + 1).(type) {
		case lua.LNumber:
			args[i] = a.String()
		case lua.LString:
			args[i] = string(a)
		default:
			l.RaiseError("Lua redis lib command arguments must be strings or integers")
		}
	}
	s.reply.Reset()
	s.replyR.Reset(&s.reply)
	peer := server.NewPeer(s.replyW)
	peer.Ctx = s.nested
	s.m.Server().Dispatch(peer, args)
	_ = s.replyW.Flush() // into a bytes.Buffer, which takes everything
	res, err := server.ParseReply(s.replyR)
	if err != nil {
		if raise {
			l.RaiseError("%s", err.Error())
		}
		l.Push(field(l, "err", err.Error()))
		return 1
	}
	l.Push(toLua(l, res))
	return 1
}

// toLua converts a reply as Redis does for a script.
func toLua(l *lua.LState, res any) lua.LValue {
	switch r := res.(type) {
	case nil:
		return lua.LFalse
	case int:
		return lua.LNumber(r)
	case string:
		return lua.LString(r)
	case server.Simple:
		return field(l, "ok", string(r))
	case []any:
		t := l.CreateTable(len(r), 0)
		for i, e := range r {
			t.RawSetInt(i+1, toLua(l, e))
		}
		return t
	}
	panic(fmt.Sprintf("luastore: a reply of type %T", res))
}

// script answers SCRIPT LOAD, EXISTS and FLUSH.
func (s *Store) script(c *server.Peer, args []string) {
	if len(args) == 0 {
		c.WriteError("ERR wrong number of arguments for 'script' command")
		return
	}
	switch strings.ToUpper(args[0]) {
	case "LOAD":
		if len(args) != 2 {
			c.WriteError("ERR wrong number of arguments for 'script|load' command")
			return
		}
		if _, err := s.compile(args[1]); err != nil {
			c.WriteError(err.Error())
			return
		}
		sum := sha1.Sum([]byte(args[1]))
		c.WriteBulk(hex.EncodeToString(sum[:]))
	case "EXISTS":
		c.WriteLen(len(args) - 1)
		for _, sha := range args[1:] {
			_, ok := s.scripts[strings.ToLower(sha)]
			c.WriteInt(map[bool]int{false: 0, true: 1}[ok])
		}
	case "FLUSH":
		s.scripts = map[string]*lua.LFunction{}
		c.WriteOK()
	default:
		c.WriteError("ERR unknown subcommand '" + args[0] + "'")
	}
}

// function answers FUNCTION LOAD [REPLACE], DELETE and FLUSH.
func (s *Store) function(c *server.Peer, args []string) {
	if len(args) == 0 {
		c.WriteError("ERR wrong number of arguments for 'function' command")
		return
	}
	switch strings.ToUpper(args[0]) {
	case "LOAD":
		replace := len(args) == 3 && strings.EqualFold(args[1], "REPLACE")
		if len(args) != 2 && !replace {
			c.WriteError("ERR wrong number of arguments for 'function|load' command")
			return
		}
		name, err := s.load(args[len(args)-1], replace)
		if err != nil {
			c.WriteError(err.Error())
			return
		}
		c.WriteBulk(name)
	case "DELETE":
		if len(args) != 2 {
			c.WriteError("ERR wrong number of arguments for 'function|delete' command")
			return
		}
		if _, ok := s.libraries[args[1]]; !ok {
			c.WriteError("ERR Library not found")
			return
		}
		s.deleteLibrary(args[1])
		c.WriteOK()
	case "FLUSH":
		s.functions = map[string]*lua.LFunction{}
		s.libraries = map[string][]string{}
		c.WriteOK()
	default:
		c.WriteError("ERR unknown subcommand '" + args[0] + "'")
	}
}

// load runs a library's code, which registers its functions.
func (s *Store) load(code string, replace bool) (string, error) {
	first, body, _ := strings.Cut(code, "\n")
	name, ok := strings.CutPrefix(first, "#!lua name=")
	if !ok || name == "" {
		return "", errors.New("ERR Missing library metadata")
	}
	if _, exists := s.libraries[name]; exists && !replace {
		return "", fmt.Errorf("ERR Library '%s' already exists", name)
	}
	// The shebang line becomes a blank one: line numbers stay the file's.
	proto, err := compiled("\n" + body)
	if err != nil {
		return "", fmt.Errorf("ERR Error compiling function: %w", err)
	}
	fn := s.l.NewFunctionFromProto(proto)
	s.loading = map[string]*lua.LFunction{}
	err = s.l.CallByParam(lua.P{Fn: fn, NRet: 0, Protect: true})
	registered := s.loading
	s.loading = nil
	s.l.SetTop(0)
	if err != nil {
		return "", fmt.Errorf("ERR Error registering functions: %w", err)
	}
	if len(registered) == 0 {
		return "", errors.New("ERR No functions registered")
	}
	old := s.libraries[name]
	for f := range registered {
		if _, taken := s.functions[f]; taken && !slices.Contains(old, f) {
			return "", fmt.Errorf("ERR Function %s already exists", f)
		}
	}
	s.deleteLibrary(name)
	for f, fn := range registered {
		s.functions[f] = fn
		s.libraries[name] = append(s.libraries[name], f)
	}
	return name, nil
}

func (s *Store) deleteLibrary(name string) {
	for _, f := range s.libraries[name] {
		delete(s.functions, f)
	}
	delete(s.libraries, name)
}

// register is redis.register_function(name, callback), or its table form
// {function_name = name, callback = f}.
func (s *Store) register(l *lua.LState) int {
	if s.loading == nil {
		l.RaiseError("redis.register_function can only be called while a function library loads")
	}
	var name string
	var fn *lua.LFunction
	if t, ok := l.Get(1).(*lua.LTable); ok {
		name = t.RawGetString("function_name").String()
		fn, _ = t.RawGetString("callback").(*lua.LFunction)
	} else {
		name, fn = l.CheckString(1), l.CheckFunction(2)
	}
	if name == "" || fn == nil {
		l.RaiseError("redis.register_function needs a name and a callback")
	}
	if _, dup := s.loading[name]; dup {
		l.RaiseError("Function already exists in the library")
	}
	s.loading[name] = fn
	return 0
}
