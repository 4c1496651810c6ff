// The C half of luastore: what Go calls in Lua's C API, and the redis
// library's entry points. The entry points run in C so that a Lua error
// (a longjmp) never crosses a Go frame: the Go half reports an error by
// its return value, and C raises it.
#include <stddef.h>
#include <stdint.h>
#include <lua.h>
#include <lauxlib.h>

lua_State *luastore_open(uintptr_t store);
void luastore_close(lua_State *L);
int luastore_load(lua_State *L, const char *code, size_t len, const char *name);
void luastore_push_ref(lua_State *L, int ref);
int luastore_push_reply(lua_State *L, const char *reply, size_t len, int raise);
void luastore_push_strings(lua_State *L, const char *data, const size_t *lens, int n);
void luastore_set_global(lua_State *L, const char *name);
void luastore_push_field(lua_State *L, const char *name, const char *value, size_t len);
char *luastore_reply(lua_State *L, int resp3, size_t *len);
const char *luastore_error(lua_State *L, size_t *len);
char *luastore_dump(lua_State *L, size_t *len);
