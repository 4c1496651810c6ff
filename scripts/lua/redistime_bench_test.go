package lua

import (
	"context"
	"fmt"
	"net"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// BenchmarkRedisTimePerHit measures what one hit costs Redis inside the
// decide function, per algorithm, beside the two native commands
// envoyproxy/ratelimit sends per decision (INCRBY + EXPIRE) and beside a
// bare function that only reads and writes the batch's keys as decide does
// (TIME, one MGET, one SET with its expiry per key). Each decide call
// carries decideBatch hits on distinct keys of a 10,000-key space, about
// what the batcher gathers from 64 streams. The metric is Redis's own
// command time (INFO commandstats usec, for a function call everything it
// ran included), per hit: no network, no system call, so it shows the
// script's work, not a decision's whole cost to Redis (bench.md has that).
// It needs redis-server on PATH.
func BenchmarkRedisTimePerHit(b *testing.B) {
	c := startRedis(b)
	ctx := context.Background()
	if err := c.FunctionLoad(ctx, Library()).Err(); err != nil {
		b.Fatal(err)
	}
	if err := c.FunctionLoad(ctx, bareLibrary).Err(); err != nil {
		b.Fatal(err)
	}
	for _, a := range []struct {
		name string
		arg  string // the hit's argument (decide.lua): limits no key reaches
	}{
		{"sliding_window_log", "1:ce:100000000:1:1"},
		{"sliding_window_counter", "2:ce:100000000:1:1"},
		{"fixed_window", "3:ce:100000000:1:1"},
		{"gcra", "4:ce:100000000:1:1:100000000"},
		{"reference_fixed_window", "5:ce:100000000:1:1"},
	} {
		b.Run("decide/"+a.name, func(b *testing.B) {
			perHit(b, c, "commandstats", "fcall", func(keys []string) error {
				args := make([]any, 0, 2*len(keys))
				for range keys {
					args = append(args, 1, a.arg)
				}
				return c.FCall(ctx, DecideFunction(), keys, args...).Err()
			})
		})
	}
	b.Run("bare-function", func(b *testing.B) {
		perHit(b, c, "commandstats", "fcall", func(keys []string) error {
			return c.FCall(ctx, "ratelimit_bare", keys).Err()
		})
	})
	b.Run("native-incrby-expire", func(b *testing.B) {
		perHit(b, c, "commandstats", "incrby expire", func(keys []string) error {
			p := c.Pipeline()
			for _, k := range keys {
				p.IncrBy(ctx, k, 1)
				p.Expire(ctx, k, time.Second)
			}
			_, err := p.Exec(ctx)
			return err
		})
	})
}

const decideBatch = 17

// bareLibrary reads and writes a batch's keys as decide does, and decides
// nothing: what per-key work any decide function pays.
const bareLibrary = `#!lua name=ratelimit_bare
redis.register_function('ratelimit_bare', function(keys)
  local t = redis.call('TIME')
  redis.call('MGET', unpack(keys))
  local reply = {}
  for i = 1, #keys do
    redis.call('SET', keys[i], t[1] .. ':1:0', 'PX', '2000')
    reply[4 * i - 3], reply[4 * i - 2], reply[4 * i - 1], reply[4 * i] = 2, 99, 1000000, 0
  end
  return reply
end)`

// perHit runs call on b.N batches of keys and reports the Redis command
// time of the commands named (space-separated) per hit.
func perHit(b *testing.B, c *redis.Client, section, commands string, call func(keys []string) error) {
	ctx := context.Background()
	prefix := strconv.Itoa(int(time.Now().UnixNano())) // a fresh keyspace: no other benchmark's types
	if err := c.ConfigResetStat(ctx).Err(); err != nil {
		b.Fatal(err)
	}
	keys := make([]string, decideBatch)
	n := 0
	b.ResetTimer()
	for b.Loop() {
		for i := range keys {
			keys[i] = fmt.Sprintf("{%s:%d}", prefix, (n*7919)%10_000)
			n++
		}
		if err := call(keys); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	info, err := c.Info(ctx, section).Result()
	if err != nil {
		b.Fatal(err)
	}
	var usec float64
	for _, name := range strings.Fields(commands) {
		usec += commandUsec(b, info, name)
	}
	b.ReportMetric(usec/float64(n), "redis-µs/hit")
}

// commandUsec reads the usec= of command name from INFO commandstats.
func commandUsec(b *testing.B, info, name string) float64 {
	for line := range strings.Lines(info) {
		rest, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_"+name+":")
		if !ok {
			continue
		}
		_, rest, _ = strings.Cut(rest, "usec=")
		usec, _, _ := strings.Cut(rest, ",")
		v, err := strconv.ParseFloat(usec, 64)
		if err != nil {
			b.Fatalf("commandstats line %q: %v", line, err)
		}
		return v
	}
	b.Fatalf("no command %s in INFO commandstats", name)
	return 0
}

// startRedis starts a redis-server on a free loopback port for b, stopped
// when b ends.
func startRedis(b *testing.B) *redis.Client {
	b.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		b.Skip("redis-server is not on PATH")
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	_ = l.Close()
	cmd := exec.Command("redis-server", "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no")
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:" + strconv.Itoa(port)})
	b.Cleanup(func() { _ = c.Close() })
	for end := time.Now().Add(10 * time.Second); c.Ping(context.Background()).Err() != nil; {
		if time.Now().After(end) {
			b.Fatal("redis-server did not answer within 10 s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	return c
}
