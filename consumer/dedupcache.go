package consumer

import (
	"math/bits"
	"sync"
	"sync/atomic"
)

// DefaultDedupCacheSize is the default ProcessorConfig.DedupCacheSize.
const DefaultDedupCacheSize = 10000

// dedupCache remembers, for one consumer group, the request hash of events
// whose dedup row is known to be committed: the Processor adds an entry only
// after its own commit succeeded, or after it read the committed row on a
// database dedup hit. So a cached entry never claims an effect that did not
// commit, and a duplicate with the same hash can be ACKed without a database
// round trip. A different hash is not decided here: it goes down the
// database path, where the conflict is detected and parked.
//
// It is bounded: at most max entries, the oldest insertion evicted first
// (FIFO; duplicates cluster shortly after the first delivery). A nil
// *dedupCache is a disabled cache.
type dedupCache struct {
	mu   sync.Mutex
	max  int
	m    map[string]string // event id -> request hash
	ring []string          // event ids in insertion order, len <= max
	next int               // ring slot of the oldest entry once the ring is full
	hits int64
}

// newDedupCache returns a cache of at most size entries, or nil (disabled)
// when size <= 0.
func newDedupCache(size int) *dedupCache {
	if size <= 0 {
		return nil
	}
	return &dedupCache{max: size, m: make(map[string]string, min(size, 1024))}
}

// hit reports whether id is cached with exactly hash, and counts it if so.
func (c *dedupCache) hit(id, hash string) bool {
	if c == nil {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	h, ok := c.m[id]
	if ok && h == hash {
		c.hits++
		return true
	}
	return false
}

// add records that id committed with hash.
func (c *dedupCache) add(id, hash string) {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.m[id]; ok {
		c.m[id] = hash // same position: a dedup row never changes its hash
		return
	}
	if len(c.ring) < c.max {
		c.ring = append(c.ring, id)
	} else {
		delete(c.m, c.ring[c.next])
		c.ring[c.next] = id
		c.next = (c.next + 1) % c.max
	}
	c.m[id] = hash
}

// DedupCacheStats describe the Processor's in-memory cache of committed
// (event id, request hash) pairs.
type DedupCacheStats struct {
	Capacity int   // ProcessorConfig.DedupCacheSize; 0 when disabled
	Entries  int   // entries held now (<= Capacity)
	Hits     int64 // duplicates ACKed from the cache, without the database (also counted in Stats.Duplicates)
}

func (c *dedupCache) stats() DedupCacheStats {
	if c == nil {
		return DedupCacheStats{}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return DedupCacheStats{Capacity: c.max, Entries: len(c.m), Hits: c.hits}
}

// dupWindow remembers whether each of the last 64 events the database path
// decided was already in the consume log. In a duplicate storm (at least
// stormDups of them) the Processor reads the committed dedup row before
// opening a transaction; otherwise a first delivery pays nothing for it.
type dupWindow struct{ bits atomic.Uint64 }

const stormDups = 48 // of 64

func (w *dupWindow) record(dup bool) {
	var b uint64
	if dup {
		b = 1
	}
	for {
		old := w.bits.Load()
		if w.bits.CompareAndSwap(old, old<<1|b) {
			return
		}
	}
}

func (w *dupWindow) storm() bool { return bits.OnesCount64(w.bits.Load()) >= stormDups }
