// Package luastore runs Lua on a miniredis the way Redis does: in Lua 5.1's
// own interpreter, the one Redis embeds (through cgo: Debian's
// liblua5.1-0-dev), a script or a function library compiled once, on
// SCRIPT LOAD, EVAL or FUNCTION LOAD, and kept in one Lua state with its
// globals protected; each EVALSHA runs the compiled chunk, each FCALL calls
// the registered function, whose library keeps its locals between calls.
// miniredis itself builds a Lua state of its Go interpreter and runs the
// whole script text on every call, which was most of the simulator's time.
// It is for tests and the simulator only: it speaks to database 0, with no
// MULTI around its commands and no read-only scripts.
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

	"github.com/alicebob/miniredis/v2"
	"github.com/alicebob/miniredis/v2/server"
)

// Store is the Lua of one miniredis.
type Store struct {
	m  *miniredis.Miniredis
	st *state // nil once closed
	// nested is miniredis's context of a command a script calls: it
	// runs without taking the server's lock, which the script holds.
	nested    any
	scripts   map[string]chunk    // by SHA1
	functions map[string]chunk    // by name
	libraries map[string][]string // a library's functions
	loading   map[string]chunk    // what a FUNCTION LOAD registers; nil outside one
	reply     bytes.Buffer        // a called command's reply
	replyW    *bufio.Writer       // into reply
}

// ctxCommand is the command Install calls from one of miniredis's own
// scripts to learn the context of a script's commands.
const ctxCommand = "LUASTORE.CONTEXT"

// RunT starts a miniredis for t whose scripts and functions run on a Store,
// which is closed when t ends, before the miniredis.
func RunT(t miniredis.Tester) (*miniredis.Miniredis, *Store) {
	m := miniredis.RunT(t)
	s, err := Install(m)
	if err != nil {
		t.Fatalf("luastore: %v", err)
	}
	t.Cleanup(s.Close) // cleanups run last first: before m's Close
	return m, s
}

// Install makes m's scripts and functions run on a Store, until Close.
func Install(m *miniredis.Miniredis) (*Store, error) {
	s := &Store{m: m}
	s.replyW = bufio.NewWriter(&s.reply)
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
	if s.st, err = newState(s); err != nil {
		return nil, err
	}
	s.scripts, s.functions, s.libraries = map[string]chunk{}, map[string]chunk{}, map[string][]string{}
	m.Server().SetPreHook(s.hook)
	return s, nil
}

// Close frees the Lua state; scripting commands fail after it.
func (s *Store) Close() {
	s.m.Lock()
	defer s.m.Unlock()
	if s.st != nil {
		s.st.close()
		s.st = nil
	}
}

// Flush forgets every script and function library, as a restart of Redis
// does.
func (s *Store) Flush() {
	s.m.Lock()
	defer s.m.Unlock()
	if s.st == nil {
		return
	}
	s.flushScripts()
	s.flushFunctions()
}

func (s *Store) flushScripts() {
	for _, c := range s.scripts {
		s.st.forget(c)
	}
	clear(s.scripts)
}

func (s *Store) flushFunctions() {
	for _, c := range s.functions {
		s.st.forget(c)
	}
	clear(s.functions)
	clear(s.libraries)
}

// scripting reports a command this store answers (cmd in upper case).
func scripting(cmd string) bool {
	switch cmd {
	case "EVAL", "EVALSHA", "FCALL", "SCRIPT", "FUNCTION":
		return true
	}
	return false
}

// hook answers the scripting commands; the others go on to miniredis.
func (s *Store) hook(c *server.Peer, cmd string, args ...string) bool {
	if !scripting(cmd) {
		return false
	}
	s.m.Lock()
	defer s.m.Unlock()
	if s.st == nil {
		c.WriteError("ERR luastore is closed")
		return true
	}
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
		s.st.call(c, fn, keys, argv)
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

// compile keeps script's chunk, a function Redis would name f_<sha>.
func (s *Store) compile(script string) (chunk, error) {
	sum := sha1.Sum([]byte(script))
	sha := hex.EncodeToString(sum[:])
	if fn, ok := s.scripts[sha]; ok {
		return fn, nil
	}
	fn, err := s.st.compile(script, "@user_script")
	if err != nil {
		return 0, fmt.Errorf("ERR Error compiling script (new function): %w", err)
	}
	s.scripts[sha] = fn
	return fn, nil
}

// eval runs a script's chunk with its KEYS and ARGV.
func (s *Store) eval(c *server.Peer, fn chunk, args []string) {
	keys, argv, err := split(args)
	if err != nil {
		c.WriteError(err.Error())
		return
	}
	s.st.setGlobals(keys, argv)
	s.st.call(c, fn)
}

// dispatch runs a command a script calls on miniredis, within the
// script's lock, and returns its reply as RESP2 (the C half pushes it into
// Lua: one cgo call, where pushing its values from Go took one each).
// Scripting commands are refused, as Redis refuses them (and this store
// holds the lock they would take).
func (s *Store) dispatch(args []string) ([]byte, error) {
	if scripting(strings.ToUpper(args[0])) {
		return nil, errors.New("ERR This Redis command is not allowed from script")
	}
	s.reply.Reset()
	peer := server.NewPeer(s.replyW)
	peer.Ctx = s.nested
	s.m.Server().Dispatch(peer, args)
	_ = s.replyW.Flush() // into a bytes.Buffer, which takes everything
	return s.reply.Bytes(), nil
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
		s.flushScripts()
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
		s.flushFunctions()
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
	lib, err := s.st.compile("\n"+body, "@user_function")
	if err != nil {
		return "", fmt.Errorf("ERR Error compiling function: %w", err)
	}
	s.loading = map[string]chunk{}
	err = s.st.run(lib)
	s.st.forget(lib)
	registered := s.loading
	s.loading = nil
	refuse := func(err error) (string, error) {
		for _, fn := range registered {
			s.st.forget(fn)
		}
		return "", err
	}
	if err != nil {
		return refuse(fmt.Errorf("ERR Error registering functions: %w", err))
	}
	if len(registered) == 0 {
		return refuse(errors.New("ERR No functions registered"))
	}
	old := s.libraries[name]
	for f := range registered {
		if _, taken := s.functions[f]; taken && !slices.Contains(old, f) {
			return refuse(fmt.Errorf("ERR Function %s already exists", f))
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
		s.st.forget(s.functions[f])
		delete(s.functions, f)
	}
	delete(s.libraries, name)
}
