package limiter

import (
	"context"
	"sync"

	"github.com/redis/go-redis/v9"
)

// router says where a script runs. Outside Redis Cluster every key goes to
// the one server; in a cluster, each hash slot's keys go to its master.
type router interface {
	// slot groups keys: keys with equal slots may share one script.
	slot(key string) int
	// server returns the server for keys sharing key's slot.
	server(ctx context.Context, key string) (redis.UniversalClient, error)
	// failed is told of every failed script call.
	failed(err error)
	// live lists the servers in use now, when the router has several that
	// can come and go; ok is false otherwise.
	live(ctx context.Context) (servers []redis.UniversalClient, ok bool)
}

// singleRouter sends everything to one server: standalone, Sentinel (the
// failover client follows the master) or the embedded store.
type singleRouter struct{ client redis.UniversalClient }

func (singleRouter) slot(string) int { return 0 }

func (r singleRouter) server(context.Context, string) (redis.UniversalClient, error) {
	return r.client, nil
}

func (singleRouter) failed(error) {}

func (singleRouter) live(context.Context) ([]redis.UniversalClient, bool) { return nil, false }

// clusterRouter runs each slot's scripts on the client of the slot's master,
// not through the cluster client's own routing: that one re-sends a command
// after a lost reply, and the decide script is not idempotent. A failed call
// (MOVED after a failover or a resharding, a dead node) makes it reload the
// slot map in the background; that request is answered by failure mode and
// the next ones go where the slots now are.
type clusterRouter struct{ cluster *redis.ClusterClient }

func (clusterRouter) slot(key string) int { return keySlot(key) }

func (r clusterRouter) server(ctx context.Context, key string) (redis.UniversalClient, error) {
	return r.cluster.MasterForKey(ctx, key)
}

func (r clusterRouter) failed(error) { r.cluster.ReloadState(context.Background()) }

func (r clusterRouter) live(ctx context.Context) ([]redis.UniversalClient, bool) {
	var mu sync.Mutex
	var masters []redis.UniversalClient
	err := r.cluster.ForEachMaster(ctx, func(_ context.Context, c *redis.Client) error {
		mu.Lock()
		defer mu.Unlock()
		masters = append(masters, c)
		return nil
	})
	return masters, err == nil // on error, keep every batcher: better idle than gone
}
