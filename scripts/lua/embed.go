// Package lua holds the Redis Lua scripts of the rate limiter, embedded into
// the binary so the deployed service always runs the scripts it was tested
// with.
//
// Each algorithm lives in its own file and defines a local table with three
// functions (check, commit, result); prelude.lua holds their shared helpers.
// decide.lua runs them: it reads Redis TIME once, checks every hit of a
// request, charges them only when no enforced hit is over its limit, and
// reports per hit. Decide is the concatenation of the files, run as one
// atomic script.
package lua

import _ "embed"

var (
	//go:embed prelude.lua
	prelude string
	//go:embed sliding_window_log.lua
	slidingWindowLog string
	//go:embed sliding_window_counter.lua
	slidingWindowCounter string
	//go:embed fixed_window.lua
	fixedWindow string
	//go:embed decide.lua
	decide string
	//go:embed reset.lua
	reset string
	//go:embed refund.lua
	refund string
)

// Decide is the script that decides a whole request atomically. Its calling
// convention is documented at the top of decide.lua.
var Decide = prelude + slidingWindowLog + slidingWindowCounter + fixedWindow + decide

// Reset is the script that deletes one counter, whatever its algorithm. Its
// calling convention is documented at the top of reset.lua.
var Reset = prelude + reset

// Refund is the script that undoes charges made by Decide, for a request
// denied across Redis Cluster slots. Its calling convention is documented at
// the top of refund.lua.
var Refund = prelude + refund
