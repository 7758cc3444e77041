package consumer

import "sync"

// failedSetSize bounds the Processor's set of event ids with attempt rows
// (about 100 bytes per entry).
const failedSetSize = 4096

// failedSet remembers the event ids for which this process recorded (or, at
// Consumer.Start, found) an attempt row that no success has cleared yet. A
// success or dedup hit of such an id deletes its attempt row; for any other
// id a first delivery (ReconsumeTimes 0) issues no delete at all, so the
// common path pays nothing for the bookkeeping (see Processor.apply).
//
// It is a hint, bounded FIFO: an id evicted here still has its attempt row
// cleared when the failed copy comes back as a retry (ReconsumeTimes > 0),
// which every success and dedup hit of a retry does. A nil *failedSet is
// empty.
type failedSet struct {
	mu   sync.Mutex
	max  int
	seq  uint64
	m    map[string]uint64 // event id -> sequence number of its ring entry
	ring []failedEntry     // insertion order; stale entries are skipped
	next int
}

type failedEntry struct {
	id  string
	seq uint64
}

func newFailedSet(size int) *failedSet {
	return &failedSet{max: size, m: make(map[string]uint64)}
}

func (s *failedSet) add(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.m[id]; ok {
		return
	}
	s.seq++
	e := failedEntry{id: id, seq: s.seq}
	if len(s.ring) < s.max {
		s.ring = append(s.ring, e)
	} else {
		old := s.ring[s.next]
		if s.m[old.id] == old.seq { // not removed and re-added since
			delete(s.m, old.id)
		}
		s.ring[s.next] = e
		s.next = (s.next + 1) % s.max
	}
	s.m[id] = e.seq
}

func (s *failedSet) has(id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.m[id]
	return ok
}

func (s *failedSet) remove(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.m, id)
}

func (s *failedSet) len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.m)
}
