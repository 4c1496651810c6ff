package app

import (
	"os"
	"runtime/debug"
)

// setRuntimeDefaults gives the Go runtime the service's defaults where the
// environment leaves them (unset or empty, as the runtime reads them): a GC
// target of 400% and a soft memory limit of memoryLimit (0: none). It
// returns the memory limit in force, or 0 when there is none.
func setRuntimeDefaults(memoryLimit int64) int64 {
	// The heap is small and nearly all garbage is per request: a GC target
	// of 400% instead of 100% trades a little memory for less CPU per
	// decision.
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(400)
	}
	// That target lets the heap grow to five times what is live before a
	// collection: in a flood of maximal requests, live memory is large and
	// five times it is past any container's limit. The soft limit makes the
	// GC collect sooner as the heap nears it, so the peak stays near what
	// is live (docs/reliability.md).
	if os.Getenv("GOMEMLIMIT") == "" && memoryLimit > 0 {
		debug.SetMemoryLimit(memoryLimit)
	}
	if limit := debug.SetMemoryLimit(-1); limit != 1<<63-1 {
		return limit
	}
	return 0
}
