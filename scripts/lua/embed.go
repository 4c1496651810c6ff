// Package lua holds the Redis Lua scripts of the rate limiter, embedded into
// the binary so the deployed service always runs the scripts it was tested
// with.
//
// Each algorithm lives in its own file and defines a local table with four
// functions (check, commit, result, refund); prelude.lua holds their shared
// helpers. gcra.lua is also part of Refund, which uses its refund function.
// decide.lua runs them: it reads Redis TIME once and decides a batch of
// requests in order, each all or nothing. The decide code reaches Redis in
// one of two forms: Library, a Redis Functions library (Redis 7 and later:
// loaded once, called with FCALL), or Decide, the same code as a script for
// EVALSHA (older servers and the embedded store).
package lua

import (
	"crypto/sha1"
	_ "embed"
	"encoding/hex"
)

var (
	//go:embed prelude.lua
	prelude string
	//go:embed sliding_window_log.lua
	slidingWindowLog string
	//go:embed sliding_window_counter.lua
	slidingWindowCounter string
	//go:embed fixed_window.lua
	fixedWindow string
	//go:embed gcra.lua
	gcra string
	//go:embed decide.lua
	decide string
	//go:embed reset.lua
	reset string
	//go:embed refund.lua
	refund string
)

// decideCode defines the local function decide(keys, args).
var decideCode = prelude + slidingWindowLog + slidingWindowCounter + fixedWindow + gcra + decide

// Decide is the script that decides a batch of requests. Its calling
// convention is documented at the top of decide.lua.
var Decide = decideCode + "return decide(KEYS, ARGV)\n"

// version names the decide code: instances running different code register
// different functions, so a rolling update never runs one version's
// arguments through the other's code.
var version = func() string {
	sum := sha1.Sum([]byte(decideCode))
	return hex.EncodeToString(sum[:6])
}()

// DecideFunction is the name under which Library registers decide; FCALL
// takes the same keys and arguments as Decide.
var DecideFunction = "ratelimit_decide_" + version

// Library is the Redis Functions library (FUNCTION LOAD) that registers
// DecideFunction. It declares no flags: it writes, so Redis refuses it as a
// whole, before it runs, when maxmemory is reached, and its keys share one
// slot in a cluster.
var Library = "#!lua name=ratelimit_" + version + "\n" + decideCode +
	"redis.register_function('" + DecideFunction + "', decide)\n"

// Reset is the script that deletes one counter, whatever its algorithm. Its
// calling convention is documented at the top of reset.lua.
var Reset = reset

// Refund is the script that undoes charges made by Decide, for a request
// denied across Redis Cluster slots. Its calling convention is documented at
// the top of refund.lua.
var Refund = prelude + gcra + refund
