package luastore

import (
	"bufio"
	"context"
	"net"
	"strings"
	"testing"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func open(t *testing.T) (*Store, *redis.Client) {
	t.Helper()
	m := miniredis.RunT(t)
	s, err := Install(m)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	c := redis.NewClient(&redis.Options{Addr: m.Addr()})
	t.Cleanup(func() { c.Close() })
	return s, c
}

// TestReplies converts Lua values to replies as Redis does, and replies of
// called commands back to Lua.
func TestReplies(t *testing.T) {
	_, c := open(t)
	ctx := context.Background()
	if err := c.Set(ctx, "k", "7", 0).Err(); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		script string
		keys   []string
		args   []any
		want   any
		err    string
	}{
		{script: "return 3.9", want: int64(3)},
		{script: "return true", want: int64(1)},
		{script: "return false", err: "redis: nil"},
		{script: "return 'x'", want: "x"},
		{script: "return {1, 'a', {2}, nil, 5}", want: []any{int64(1), "a", []any{int64(2)}}},
		{script: "return redis.status_reply('FINE')", want: "FINE"},
		{script: "return redis.error_reply('ERR no')", err: "ERR no"},
		{script: "return {KEYS[1], ARGV[2]}", keys: []string{"a"}, args: []any{"b", "c"}, want: []any{"a", "c"}},
		{script: "return redis.call('GET', KEYS[1]) + 1", keys: []string{"k"}, want: int64(8)},
		{script: "return redis.call('GET', 'missing') == false", want: int64(1)},
		{script: "return redis.call('INCRBY', 'k', 2)", want: int64(9)},
		{script: "return redis.call('SET', 'j', 1)['ok']", want: "OK"},
		{script: "redis.call('ZADD', 'z', 1, 'a', 2, 'b'); return redis.call('ZRANGE', 'z', 0, -1, 'WITHSCORES')", want: []any{"a", "1", "b", "2"}},
		{script: "local r = redis.call('MGET', 'k', 'missing', 'j'); return {r[1], r[2] == false, r[3], #r}", want: []any{"9", int64(1), "1", int64(3)}},
		{script: "return #redis.call('ZRANGE', 'missing', 0, -1)", want: int64(0)},
		{script: "redis.call('MSET', 'a1', 1, 'a2', 2, 'a3', 3, 'a4', 4, 'a5', 5, 'a6', 6, 'a7', 7, 'a8', 8, 'a9', 9, 'a10', 10); return redis.call('GET', 'a10')", want: "10"}, // more arguments than call lists on the C stack
		{script: "return redis.pcall('HGET', 'k', 'f')['err']", want: "WRONGTYPE Operation against a key holding the wrong kind of value"},
		{script: "return redis.call('HGET', 'k', 'f')", err: "WRONGTYPE"},
		// Numbers as Lua 5.1 and Redis 7.0 format them (each checked on
		// redis-server): tostring with 14 digits, a command's argument
		// with 17.
		{script: "return tostring(1764680000000000)", want: "1.76468e+15"},
		{script: "redis.call('SET', 'n', 1764680000000001); return redis.call('GET', 'n')", want: "1764680000000001"},
		{script: "redis.call('SET', 'n', 0.1); return redis.call('GET', 'n')", want: "0.10000000000000001"},
		{script: "return {1.9, -2.5}", want: []any{int64(1), int64(-2)}},
		{script: "x = 1", err: "readonly table"},
		{script: "return y", err: "nonexistent global variable 'y'"},
		{script: "return (", err: "compiling"},
	} {
		got, err := c.Eval(ctx, tc.script, tc.keys, tc.args...).Result()
		switch {
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("%s: %v, %v; want the error %q", tc.script, got, err, tc.err)
		case tc.err == "" && err != nil:
			t.Errorf("%s: %v", tc.script, err)
		case tc.err == "" && !equal(got, tc.want):
			t.Errorf("%s: %#v, want %#v", tc.script, got, tc.want)
		}
	}
}

func equal(a, b any) bool {
	as, ok := a.([]any)
	if !ok {
		return a == b
	}
	bs, ok := b.([]any)
	if !ok || len(as) != len(bs) {
		return false
	}
	for i := range as {
		if !equal(as[i], bs[i]) {
			return false
		}
	}
	return true
}

// TestScriptsAndFunctions keeps a script by its SHA1 and a library's
// functions with their locals between calls, until a Flush (a restart).
func TestScriptsAndFunctions(t *testing.T) {
	s, c := open(t)
	ctx := context.Background()
	script := redis.NewScript("local n = 0; n = n + 1; return n")
	if err := script.Load(ctx, c).Err(); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if n, err := script.EvalSha(ctx, c, nil).Int(); err != nil || n != 1 {
			t.Fatalf("EVALSHA: %d, %v; want 1: a script's locals are its call's", n, err)
		}
	}
	lib := "#!lua name=counting\nlocal n = 0\nredis.register_function('count', function(keys, args) n = n + tonumber(args[1]); return {n, keys[1]} end)\n"
	if name, err := c.FunctionLoad(ctx, lib).Result(); err != nil || name != "counting" {
		t.Fatalf("FUNCTION LOAD: %q, %v", name, err)
	}
	if err := c.FunctionLoad(ctx, lib).Err(); err == nil || !strings.Contains(err.Error(), "already exists") {
		t.Fatalf("FUNCTION LOAD again: %v, want already exists", err)
	}
	for i, want := range []int64{2, 5} {
		got, err := c.FCall(ctx, "count", []string{"key"}, []any{2 + i}...).Result()
		if err != nil || !equal(got, []any{want, "key"}) {
			t.Fatalf("FCALL %d: %v, %v; want %d: the library's locals live on", i, got, err, want)
		}
	}
	if err := c.FunctionLoadReplace(ctx, lib).Err(); err != nil {
		t.Fatal(err)
	}
	if n, err := c.FCall(ctx, "count", nil, 1).Slice(); err != nil || n[0] != int64(1) {
		t.Fatalf("FCALL after REPLACE: %v, %v; want 1", n, err)
	}
	if err := c.FunctionLoad(ctx, "#!lua name=empty\nlocal x = 1\n").Err(); err == nil {
		t.Fatal("a library registering nothing loaded")
	}
	if err := c.FunctionLoad(ctx, "#!lua name=calls\nredis.call('GET', 'k')\nredis.register_function('f', function() end)\n").Err(); err == nil {
		t.Fatal("a library calling Redis while it loads loaded")
	}
	s.Flush()
	if err := script.EvalSha(ctx, c, nil).Err(); err == nil || !strings.HasPrefix(err.Error(), "NOSCRIPT") {
		t.Fatalf("EVALSHA after a Flush: %v, want NOSCRIPT", err)
	}
	if err := c.FCall(ctx, "count", nil, 1).Err(); err == nil || !strings.Contains(err.Error(), "Function not found") {
		t.Fatalf("FCALL after a Flush: %v, want Function not found", err)
	}
}

// TestRefusals answers what a script must not do with an error, as Redis
// does, and the store goes on answering.
func TestRefusals(t *testing.T) {
	s, c := open(t)
	ctx := context.Background()
	for _, tc := range []struct {
		what, script, err string
	}{
		{"bytecode", "\x1bLua", "bytecode"},
		{"a scripting command from a script", "return redis.call('EVAL', 'return 1', '0')", "not allowed from script"},
		{"loading code", "return loadstring('return 1')()", "nonexistent global variable 'loadstring'"},
		{"a finalizer", "return newproxy(true)", "nonexistent global variable 'newproxy'"},
	} {
		if err := c.Eval(ctx, tc.script, nil).Err(); err == nil || !strings.Contains(err.Error(), tc.err) {
			t.Errorf("%s: %v, want an error with %q", tc.what, err, tc.err)
		}
	}
	lib := "#!lua name=meta\nredis.register_function(setmetatable({}, {__index = function() error('x') end}))\n"
	if err := c.FunctionLoad(ctx, lib).Err(); err == nil || !strings.Contains(err.Error(), "needs a name and a callback") {
		t.Errorf("a registration whose table raises when read: %v, want needs a name and a callback", err)
	}
	// A reply nested past the stack Lua gives a C function: the deepest
	// levels answer null.
	deep, err := c.Eval(ctx, "local t = {} for i = 1, 200 do t = {t} end return t", nil).Result()
	if err != nil {
		t.Fatalf("a deeply nested reply: %v", err)
	}
	levels := 0
	for v, ok := deep.([]any); ok && len(v) == 1; v, ok = v[0].([]any) {
		levels++
	}
	if levels < 10 {
		t.Errorf("a deeply nested reply kept %d levels, want at least 10", levels)
	}
	if n, err := c.Eval(ctx, "return 7", nil).Int(); err != nil || n != 7 {
		t.Fatalf("after the refusals: %d, %v; want 7", n, err)
	}
	s.Close()
	s.Flush() // a closed store has nothing to forget
	if err := c.Eval(ctx, "return 1", nil).Err(); err == nil || !strings.Contains(err.Error(), "closed") {
		t.Errorf("EVAL after Close: %v, want closed", err)
	}
}

// TestServeConn serves a pipeline on one connection, replies in order,
// and ends the connection on a command that is not a RESP array.
func TestServeConn(t *testing.T) {
	s, _ := open(t)
	client, server := net.Pipe()
	s.ServeConn(server)
	c := redis.NewClient(&redis.Options{
		Dialer:     func(context.Context, string, string) (net.Conn, error) { return client, nil },
		PoolSize:   1,
		MaxRetries: -1,
	})
	defer c.Close()
	ctx := context.Background()
	cmds, err := c.Pipelined(ctx, func(p redis.Pipeliner) error {
		p.Set(ctx, "k", "1", 0)
		p.IncrBy(ctx, "k", 2)
		p.Eval(ctx, "return redis.call('GET', KEYS[1])", []string{"k"})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if got := cmds[2].(*redis.Cmd).Val(); got != "3" {
		t.Fatalf("the pipeline's script read %v, want 3", got)
	}

	for _, tc := range []struct{ in, err string }{
		{in: "*2\r\n$3\r\nGET\r\n$1\r\nk\r\n"},
		{in: "GET k\r\n", err: "protocol error"},
		{in: "*1\r\n$3\r\nGETX\r\n", err: "not ended by CRLF"},
		{in: "*1\r\n$-1\r\n", err: "bulk string of -1 bytes"},
		{in: "*0\r\n", err: "an empty command"},
	} {
		args, err := readCommand(bufio.NewReader(strings.NewReader(tc.in)))
		if tc.err == "" && (err != nil || len(args) != 2 || args[0] != "GET") {
			t.Errorf("%q: %q, %v", tc.in, args, err)
		}
		if tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)) {
			t.Errorf("%q: error %v, want %q", tc.in, err, tc.err)
		}
	}
}
