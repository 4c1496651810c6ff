#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <lualib.h>
#include "luastore.h"
#include "_cgo_export.h"

static uintptr_t store_of(lua_State *L) {
	return (uintptr_t)lua_tonumber(L, lua_upvalueindex(1));
}

// call is redis.call and redis.pcall: the arguments, numbers formatted
// as Redis formats them, go to Go as pointers into Lua's own strings.
static int call(lua_State *L, int raise) {
	int n = lua_gettop(L);
	if (n == 0)
		return luaL_error(L, "Please specify at least one argument for this redis lib call");
	for (int i = 1; i <= n; i++) {
		if (lua_type(L, i) == LUA_TNUMBER) {
			char num[64];
			snprintf(num, sizeof num, "%.17g", (double)lua_tonumber(L, i));
			lua_pushstring(L, num);
			lua_replace(L, i);
		} else if (lua_type(L, i) != LUA_TSTRING) {
			return luaL_error(L, "Lua redis lib command arguments must be strings or integers");
		}
	}
	// A call's few arguments are listed on the C stack: a userdata for
	// each call was garbage for Lua's collector to sweep.
	enum { FEW = 16 };
	const char *few[FEW];
	size_t few_lens[FEW];
	const char **ptrs = few;
	size_t *lens = few_lens;
	if (n > FEW) {
		ptrs = lua_newuserdata(L, n * (sizeof(char *) + sizeof(size_t)));
		lens = (size_t *)(ptrs + n);
	}
	for (int i = 0; i < n; i++)
		ptrs[i] = lua_tolstring(L, i + 1, &lens[i]);
	int results = luastoreCall(L, store_of(L), n, (char **)ptrs, lens, raise);
	if (results < 0)
		return lua_error(L);
	return results;
}

static int redis_call(lua_State *L) { return call(L, 1); }
static int redis_pcall(lua_State *L) { return call(L, 0); }

// register_function is redis.register_function(name, callback), or its
// table form {function_name = name, callback = f}: Go gets the name, and
// the callback on top of the stack. The table's fields are read raw, so
// no metamethod of the script's runs.
static int register_function(lua_State *L) {
	if (lua_type(L, 1) == LUA_TTABLE) {
		lua_pushstring(L, "function_name");
		lua_rawget(L, 1);
		lua_pushstring(L, "callback");
		lua_rawget(L, 1);
	} else {
		lua_pushvalue(L, 1);
		lua_pushvalue(L, 2);
	}
	size_t len = 0;
	const char *name = lua_type(L, -2) == LUA_TSTRING ? lua_tolstring(L, -2, &len) : NULL;
	if (name == NULL || len == 0 || lua_type(L, -1) != LUA_TFUNCTION)
		return luaL_error(L, "redis.register_function needs a name and a callback");
	if (luastoreRegister(L, store_of(L), (char *)name, len) < 0)
		return lua_error(L);
	return 0;
}

static int reply_table(lua_State *L, const char *field) {
	const char *v = luaL_checkstring(L, 1);
	lua_newtable(L);
	lua_pushstring(L, v);
	lua_setfield(L, -2, field);
	return 1;
}

static int error_reply(lua_State *L) { return reply_table(L, "err"); }
static int status_reply(lua_State *L) { return reply_table(L, "ok"); }

// Redis refuses a script's global writes and reads of undefined globals:
// a state kept between calls must not carry a call's leftovers.
static int global_write(lua_State *L) {
	return luaL_error(L, "Attempt to modify a readonly table: %s", lua_tostring(L, 2));
}

static int global_read(lua_State *L) {
	return luaL_error(L, "Script attempted to access nonexistent global variable '%s'", lua_tostring(L, 2));
}

static void open_library(lua_State *L, lua_CFunction open, const char *name) {
	lua_pushcfunction(L, open);
	lua_pushstring(L, name);
	lua_call(L, 1, 0);
}

// A state's memory: blocks of up to POOL_MAX bytes, by size class, come
// from chunks and go back to their class's free list, not to malloc, until
// the state closes: a decide call makes and drops thousands of small
// strings and tables, and malloc's own bookkeeping was a tenth of the
// simulator's time. Lua passes a block's size to every call, so a block
// needs no header.
enum { POOL_STEP = 16, POOL_CLASSES = 32, POOL_MAX = POOL_STEP * POOL_CLASSES, POOL_CHUNK = 256 << 10 };

typedef struct {
	void *free[POOL_CLASSES];
	char *next, *end; // the newest chunk's unused part
	void *chunks;     // every chunk, linked by its first word
} pool;

static size_t pool_class(size_t n) { return (n - 1) / POOL_STEP; }

static void *pool_get(pool *p, size_t n) {
	size_t c = pool_class(n), size = (c + 1) * POOL_STEP;
	void *b = p->free[c];
	if (b != NULL) {
		p->free[c] = *(void **)b;
		return b;
	}
	if ((size_t)(p->end - p->next) < size) {
		char *chunk = malloc(POOL_CHUNK);
		if (chunk == NULL)
			return NULL;
		*(void **)chunk = p->chunks;
		p->chunks = chunk;
		p->next = chunk + POOL_STEP;
		p->end = chunk + POOL_CHUNK;
	}
	b = p->next;
	p->next += size;
	return b;
}

static void release(pool *p, void *b, size_t n) {
	if (n > POOL_MAX) {
		free(b);
		return;
	}
	*(void **)b = p->free[pool_class(n)];
	p->free[pool_class(n)] = b;
}

static void *pool_alloc(void *ud, void *ptr, size_t osize, size_t nsize) {
	pool *p = ud;
	if (ptr == NULL)
		osize = 0;
	if (nsize == 0) {
		if (ptr != NULL)
			release(p, ptr, osize);
		return NULL;
	}
	if (osize > POOL_MAX && nsize > POOL_MAX)
		return realloc(ptr, nsize);
	if (osize > 0 && osize <= POOL_MAX && nsize <= POOL_MAX && pool_class(osize) == pool_class(nsize))
		return ptr;
	void *b = nsize <= POOL_MAX ? pool_get(p, nsize) : malloc(nsize);
	if (b == NULL) {
		// Lua counts on a shrink never failing: a block from malloc
		// then stays, and goes to the pool (larger than its class) when
		// Lua frees it.
		return nsize <= osize ? ptr : NULL;
	}
	if (ptr != NULL) {
		memcpy(b, ptr, osize < nsize ? osize : nsize);
		release(p, ptr, osize);
	}
	return b;
}

static int panic(lua_State *L) {
	fprintf(stderr, "luastore: unprotected Lua error: %s\n", lua_tostring(L, -1));
	return 0;
}

void luastore_close(lua_State *L) {
	void *ud;
	lua_getallocf(L, &ud);
	lua_close(L);
	pool *p = ud;
	while (p->chunks != NULL) {
		void *next = *(void **)p->chunks;
		free(p->chunks);
		p->chunks = next;
	}
	free(p);
}

lua_State *luastore_open(uintptr_t store) {
	pool *p = calloc(1, sizeof *p);
	if (p == NULL)
		return NULL;
	lua_State *L = lua_newstate(pool_alloc, p);
	if (L == NULL) {
		free(p);
		return NULL;
	}
	lua_atpanic(L, panic);
	open_library(L, luaopen_base, "");
	open_library(L, luaopen_table, LUA_TABLIBNAME);
	open_library(L, luaopen_string, LUA_STRLIBNAME);
	open_library(L, luaopen_math, LUA_MATHLIBNAME);
	// As Redis: no files; and no code but source text (a crafted bytecode
	// chunk gets past Lua 5.1's checks), nor finalizers, whose errors
	// would reach the Go half.
	static const char *removed[] = {"dofile", "loadfile", "load", "loadstring", "newproxy"};
	for (size_t i = 0; i < sizeof removed / sizeof removed[0]; i++) {
		lua_pushnil(L);
		lua_setglobal(L, removed[i]);
	}
	lua_newtable(L);
	static const struct { const char *name; lua_CFunction fn; } fns[] = {
		{"call", redis_call}, {"pcall", redis_pcall}, {"register_function", register_function},
		{"error_reply", error_reply}, {"status_reply", status_reply},
	};
	for (size_t i = 0; i < sizeof fns / sizeof fns[0]; i++) {
		lua_pushnumber(L, (lua_Number)store);
		lua_pushcclosure(L, fns[i].fn, 1);
		lua_setfield(L, -2, fns[i].name);
	}
	lua_pushvalue(L, -1);
	lua_setglobal(L, "redis");
	lua_setglobal(L, "server");
	lua_pushvalue(L, LUA_GLOBALSINDEX);
	lua_newtable(L);
	lua_pushcfunction(L, global_write);
	lua_setfield(L, -2, "__newindex");
	lua_pushcfunction(L, global_read);
	lua_setfield(L, -2, "__index");
	lua_setmetatable(L, -2);
	lua_pop(L, 1);
	return L;
}

// luastore_load compiles code: its function on the stack and 0, or its
// error message and 1.
int luastore_load(lua_State *L, const char *code, size_t len, const char *name) {
	return luaL_loadbuffer(L, code, len, name) != 0;
}

void luastore_push_ref(lua_State *L, int ref) {
	lua_rawgeti(L, LUA_REGISTRYINDEX, ref);
}

// reply_value pushes the RESP2 value at p, before end, as Redis converts a
// command's reply for a script, and returns where the value ends; NULL on
// a malformed reply, with nothing pushed. An error is pushed as {err =
// message}.
static const char *reply_value(lua_State *L, const char *p, const char *end, int depth) {
	const char *eol = memchr(p, '\r', end - p);
	if (eol == NULL || eol + 1 >= end || eol - p < 1 || depth > 64 || !lua_checkstack(L, 3))
		return NULL;
	const char *next = eol + 2;
	char kind = *p++;
	if (kind == '+' || kind == '-') {
		lua_createtable(L, 0, 1);
		lua_pushlstring(L, p, eol - p);
		lua_setfield(L, -2, kind == '+' ? "ok" : "err");
		return next;
	}
	char *stop;
	long long n = strtoll(p, &stop, 10);
	if (stop != eol)
		return NULL;
	switch (kind) {
	case ':':
		lua_pushnumber(L, (lua_Number)n);
		return next;
	case '$':
		if (n < 0) {
			lua_pushboolean(L, 0);
			return next;
		}
		if (n > end - next - 2)
			return NULL;
		lua_pushlstring(L, next, n);
		return next + n + 2;
	case '*':
		if (n < 0) {
			lua_pushboolean(L, 0);
			return next;
		}
		lua_createtable(L, n < 1024 ? (int)n : 1024, 0);
		for (long long i = 1; i <= n; i++) {
			next = reply_value(L, next, end, depth + 1);
			if (next == NULL) {
				lua_pop(L, 1);
				return NULL;
			}
			lua_rawseti(L, -2, (int)i);
		}
		return next;
	}
	return NULL;
}

// luastore_push_reply pushes a command's RESP2 reply for a script and
// returns 1; for an error reply when raise is set (redis.call), it pushes
// the error's message instead and returns -1, for the caller to raise.
int luastore_push_reply(lua_State *L, const char *reply, size_t len, int raise) {
	if (raise && len > 0 && reply[0] == '-') {
		const char *eol = memchr(reply, '\r', len);
		lua_pushlstring(L, reply + 1, eol != NULL ? (size_t)(eol - reply - 1) : len - 1);
		return -1;
	}
	if (reply_value(L, reply, reply + len, 0) == NULL) {
		lua_pushstring(L, "luastore: a malformed reply");
		return -1;
	}
	return 1;
}

// luastore_push_strings pushes a table of n strings, laid end to end in
// data.
void luastore_push_strings(lua_State *L, const char *data, const size_t *lens, int n) {
	lua_createtable(L, n, 0);
	for (int i = 0; i < n; i++) {
		lua_pushlstring(L, data, lens[i]);
		lua_rawseti(L, -2, i + 1);
		data += lens[i];
	}
}

void luastore_set_global(lua_State *L, const char *name) {
	lua_pushstring(L, name);
	lua_insert(L, -2);
	lua_rawset(L, LUA_GLOBALSINDEX);
}

// luastore_push_field pushes {name = value}, an error or status reply.
void luastore_push_field(lua_State *L, const char *name, const char *value, size_t len) {
	lua_createtable(L, 0, 1);
	lua_pushlstring(L, value, len);
	lua_setfield(L, -2, name);
}

typedef struct {
	char *b;
	size_t n, cap;
} buffer;

static void put(buffer *o, const char *s, size_t n) {
	if (o->n + n > o->cap) {
		while (o->n + n > o->cap)
			o->cap = o->cap ? 2 * o->cap : 256;
		o->b = realloc(o->b, o->cap);
		if (o->b == NULL)
			abort();
	}
	memcpy(o->b + o->n, s, n);
	o->n += n;
}

// put_line writes a status or error line: its CR and LF become spaces.
static void put_line(buffer *o, char kind, const char *s, size_t n) {
	put(o, &kind, 1);
	for (size_t i = 0; i < n; i++)
		put(o, s[i] == '\r' || s[i] == '\n' ? " " : s + i, 1);
	put(o, "\r\n", 2);
}

// field_string pushes t[name] of the table on top and says whether it
// is a string.
static int field_string(lua_State *L, const char *name) {
	lua_pushstring(L, name);
	lua_rawget(L, -2);
	return lua_type(L, -1) == LUA_TSTRING;
}

// put_field writes t[name] of the table on top, when it is a string, as a
// line of kind (an error's '-', a status's '+'), and says whether it did.
static int put_field(lua_State *L, buffer *o, const char *name, char kind) {
	int is = field_string(L, name);
	if (is) {
		size_t len;
		const char *s = lua_tolstring(L, -1, &len);
		put_line(o, kind, s, len);
	}
	lua_pop(L, 1);
	return is;
}

// encode writes the value on top of the stack as Redis converts a Lua
// value to its reply.
static void encode(lua_State *L, buffer *o, int resp3, int depth) {
	const char *null = resp3 ? "_\r\n" : "$-1\r\n";
	char head[64];
	size_t len;
	const char *s;
	switch (lua_type(L, -1)) {
	case LUA_TBOOLEAN:
		if (lua_toboolean(L, -1))
			put(o, ":1\r\n", 4);
		else
			put(o, null, strlen(null));
		return;
	case LUA_TNUMBER:
		put(o, head, snprintf(head, sizeof head, ":%lld\r\n", (long long)lua_tonumber(L, -1)));
		return;
	case LUA_TSTRING:
		s = lua_tolstring(L, -1, &len);
		put(o, head, snprintf(head, sizeof head, "$%zu\r\n", len));
		put(o, s, len);
		put(o, "\r\n", 2);
		return;
	case LUA_TTABLE:
		if (depth > 64 || !lua_checkstack(L, 4))
			break;
		if (put_field(L, o, "err", '-') || put_field(L, o, "ok", '+'))
			return;
		int n = 0;
		for (;; n++) {
			lua_rawgeti(L, -1, n + 1);
			int end = lua_isnil(L, -1);
			lua_pop(L, 1);
			if (end)
				break;
		}
		put(o, head, snprintf(head, sizeof head, "*%d\r\n", n));
		for (int i = 1; i <= n; i++) {
			lua_rawgeti(L, -1, i);
			encode(L, o, resp3, depth + 1);
			lua_pop(L, 1);
		}
		return;
	}
	put(o, null, strlen(null));
}

// luastore_reply encodes the value on top of the stack, in memory the
// caller frees.
char *luastore_reply(lua_State *L, int resp3, size_t *len) {
	buffer o = {0};
	encode(L, &o, resp3, 0);
	*len = o.n;
	return o.b;
}

// luastore_error is the message of the error on top of the stack: a
// string, or an error reply's.
const char *luastore_error(lua_State *L, size_t *len) {
	if (lua_type(L, -1) == LUA_TTABLE) {
		field_string(L, "err");
		lua_replace(L, -2);
	}
	if (lua_type(L, -1) != LUA_TSTRING) {
		lua_pop(L, 1);
		lua_pushstring(L, "ERR an error that is not a string");
	}
	return lua_tolstring(L, -1, len);
}

static int dump_writer(lua_State *L, const void *p, size_t n, void *o) {
	(void)L;
	put(o, p, n);
	return 0;
}

// luastore_dump is the bytecode of the function on top of the stack, in
// memory the caller frees.
char *luastore_dump(lua_State *L, size_t *len) {
	buffer o = {0};
	lua_dump(L, dump_writer, &o);
	*len = o.n;
	return o.b;
}
