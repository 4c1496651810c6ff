package main

import (
	"context"
	"errors"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// floorWindow is the floor's fixed window, as the bench's allowed rules'.
const floorWindow = time.Minute

// floorClient is the floor a fixed window can reach: what a plain Redis
// client pays per decision, as envoyproxy/ratelimit's fixed window does it.
// Per request it sends, in one pipeline, INCRBY key 1 and EXPIRE key 60 for
// each descriptor, on a pool of a few connections shared by the workers.
// It compares no limit (its Redis work is the same whether the answer would
// be OK or OVER_LIMIT), so it has no allowed/denied mode.
type floorClient struct {
	client *redis.Client
}

// newFloorClient opens a client of conns connections to addr. Calls fail
// only on a Redis or connection error: a pool wait or a slow answer is
// measured, not cut short (envoyproxy/ratelimit's Redis timeout is 10 s).
func newFloorClient(addr string, conns int) *floorClient {
	return &floorClient{client: redis.NewClient(&redis.Options{
		Addr:         addr,
		PoolSize:     conns,
		MaxRetries:   -1,
		ReadTimeout:  10 * time.Second,
		WriteTimeout: 10 * time.Second,
		PoolTimeout:  10 * time.Second,
	})}
}

func (f *floorClient) Close() error { return f.client.Close() }

// caller returns the floor's call for the keys and descriptors of s. The
// key names the window it counts, as a fixed window's does:
// floor_<value>_<window start, unix seconds>.
func (f *floorClient) caller(s Scenario) func(w int) Call {
	keys := make([][]string, s.Keys)
	for i := range keys {
		for _, v := range values(i, s.Descriptors) {
			keys[i] = append(keys[i], "floor_"+v+"_")
		}
	}
	return func(int) Call {
		return func(ctx context.Context, rng *rand.Rand) (decisions, overLimit uint64, errCode string) {
			ks := keys[0]
			if len(keys) > 1 {
				ks = keys[rng.IntN(len(keys))]
			}
			return f.decide(ctx, ks)
		}
	}
}

// decide sends, in one pipeline, INCRBY and EXPIRE of each key prefix ks
// completed with the window's start.
func (f *floorClient) decide(ctx context.Context, ks []string) (decisions, overLimit uint64, errCode string) {
	win := int64(floorWindow / time.Second)
	suffix := strconv.FormatInt(time.Now().Unix()/win*win, 10)
	pipe := f.client.Pipeline()
	for _, k := range ks {
		k += suffix
		pipe.IncrBy(ctx, k, 1)
		pipe.Expire(ctx, k, floorWindow)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return 0, 0, redisErrorCode(err)
	}
	return uint64(len(ks)), 0, ""
}

// redisErrorCode names a floor call's error for the errors column.
func redisErrorCode(err error) string {
	var netErr net.Error
	switch {
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, os.ErrDeadlineExceeded):
		return deadlineExceeded
	case errors.As(err, &netErr):
		return "RedisConnection"
	default:
		return "RedisError"
	}
}
