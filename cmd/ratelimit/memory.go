package main

import (
	"fmt"
	"os"
	"runtime/debug"
	"strconv"
	"strings"
)

// defaultMemoryLimit is --memory-limit's default: below the central
// manifest's 256 MiB container limit, with room for what the Go runtime
// does not count (stacks in use are counted; the binary and its mappings
// are not).
const defaultMemoryLimit = 200 << 20

// byteSize is a flag of a number of bytes written as GOMEMLIMIT is: an
// integer with an optional unit B, KiB, MiB, GiB or TiB.
type byteSize int64

var byteUnits = []struct {
	suffix string
	shift  uint
}{{"TiB", 40}, {"GiB", 30}, {"MiB", 20}, {"KiB", 10}, {"B", 0}}

func (b *byteSize) String() string {
	for _, u := range byteUnits {
		if n := int64(*b); n != 0 && n%(1<<u.shift) == 0 {
			return strconv.FormatInt(n>>u.shift, 10) + u.suffix
		}
	}
	return "0"
}

func (b *byteSize) Set(v string) error {
	num, shift := v, uint(0)
	for _, u := range byteUnits {
		if s, ok := strings.CutSuffix(v, u.suffix); ok {
			num, shift = s, u.shift
			break
		}
	}
	n, err := strconv.ParseInt(num, 10, 64)
	if err != nil || n < 0 || n > (1<<62)>>shift {
		return fmt.Errorf("%q is not a size like 200MiB", v)
	}
	*b = byteSize(n << shift)
	return nil
}

// setRuntimeDefaults gives the Go runtime the service's defaults where the
// environment leaves them (unset or empty, as the runtime reads them): a GC
// target of 400% and a soft memory limit of memoryLimit (0: none). It
// returns the memory limit in force, or 0 when there is none.
func setRuntimeDefaults(memoryLimit int64) int64 {
	// The heap is a few MB and nearly all garbage is per request: a GC
	// target of 400% instead of 100% trades a few MB for about a fifth less
	// CPU per decision (make bench, docs/bench.md).
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
