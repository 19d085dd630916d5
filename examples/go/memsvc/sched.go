package main

import (
	"context"
	"errors"
	"fmt"
	"sync"
)

// fairScheduler admits requests to the service's work slots (the same policy
// as the Node service's lib/sched.js).
//
// `workers` requests are at work at once (reading their body, decoding it,
// running kvmem, writing the answer); the rest wait, unread, in one queue per
// client. A free slot goes to the waiting client with the fewest requests at
// work, ties to the one served least recently, so a client that floods the
// service with connections gets no more turns than one that sends a request
// now and then. One client holds at most clientRunning slots (by default all
// cores but one, and fewer than there are slots), so a newcomer never waits
// for a flood's requests to finish; and at most clientQueue requests (at work and waiting): the next
// one is refused at once (429), before its body is read.
//
// A request granted while its client has others in the service (waiting or
// at work) is marked background: the service runs it at a lower CPU
// priority (lowprio_linux.go), so a client's backlog of large bodies and
// answers does not take the cores from clients that send one request at a
// time.
type fairScheduler struct {
	mu                                  sync.Mutex
	workers, clientRunning, clientQueue int
	running, queued                     int
	clients                             map[string]*schedClient
	turn                                uint64
	draining                            bool
	idle                                []chan struct{}
}

type schedClient struct {
	id       string
	waiting  []*ticket
	running  int
	lastTurn uint64
}

// ticket is one request's place: ready is closed when it gets a slot (err nil)
// or is refused (err set).
type ticket struct {
	s       *fairScheduler
	c       *schedClient
	ready   chan struct{}
	granted bool
	busy    bool // granted while its client had other requests in the service
	err     error
	once    sync.Once
}

var (
	errQueueFull = errors.New("queue full")
	errDraining  = errors.New("the service is shutting down")
)

type queueFullError struct{ msg string }

func (e *queueFullError) Error() string { return e.msg }
func (e *queueFullError) Unwrap() error { return errQueueFull }

func newFairScheduler(workers, clientRunning, clientQueue int) *fairScheduler {
	if clientRunning > workers {
		clientRunning = workers
	}
	return &fairScheduler{workers: workers, clientRunning: clientRunning, clientQueue: clientQueue, clients: map[string]*schedClient{}}
}

// enqueue places a request of client in its queue; the ticket's ready channel
// says when it may start. Errors at once: a full queue, or draining.
func (s *fairScheduler) enqueue(client string) (*ticket, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.draining {
		return nil, errDraining
	}
	c := s.clients[client]
	if c == nil {
		c = &schedClient{id: client}
		s.clients[client] = c
	}
	if len(c.waiting)+c.running >= s.clientQueue {
		return nil, &queueFullError{fmt.Sprintf("client '%s' has %d requests in the service already (waiting or at work): retry when one is answered",
			client, s.clientQueue)}
	}
	t := &ticket{s: s, c: c, ready: make(chan struct{})}
	c.waiting = append(c.waiting, t)
	s.queued++
	s.pumpLocked()
	return t, nil
}

// acquire enqueues and waits for a slot; ctx's end takes a waiting request
// out of its queue. The release function gives the slot back (idempotent);
// background: the client had other requests in the service when it got it.
func (s *fairScheduler) acquire(ctx context.Context, client string) (release func(), background bool, err error) {
	t, err := s.enqueue(client)
	if err != nil {
		return nil, false, err
	}
	select {
	case <-t.ready:
	case <-ctx.Done():
		s.mu.Lock()
		if !t.granted && t.err == nil {
			s.dropLocked(t)
			s.mu.Unlock()
			return nil, false, ctx.Err()
		}
		s.mu.Unlock()
	}
	if t.err != nil {
		return nil, false, t.err
	}
	return t.release, t.busy, nil
}

func (s *fairScheduler) dropLocked(t *ticket) {
	for i, w := range t.c.waiting {
		if w == t {
			t.c.waiting = append(t.c.waiting[:i], t.c.waiting[i+1:]...)
			s.queued--
			break
		}
	}
	s.forgetLocked(t.c)
}

func (t *ticket) release() {
	t.once.Do(func() {
		s := t.s
		s.mu.Lock()
		defer s.mu.Unlock()
		t.c.running--
		s.running--
		s.forgetLocked(t.c)
		s.pumpLocked()
	})
}

func (s *fairScheduler) forgetLocked(c *schedClient) {
	if c.running == 0 && len(c.waiting) == 0 && s.clients[c.id] == c {
		delete(s.clients, c.id)
	}
	if s.running == 0 && s.queued == 0 {
		for _, ch := range s.idle {
			close(ch)
		}
		s.idle = nil
	}
}

func (s *fairScheduler) pumpLocked() {
	for s.running < s.workers {
		var best *schedClient
		for _, c := range s.clients {
			if len(c.waiting) == 0 || c.running >= s.clientRunning {
				continue
			}
			if best == nil || c.running < best.running || (c.running == best.running && c.lastTurn < best.lastTurn) {
				best = c
			}
		}
		if best == nil {
			return
		}
		t := best.waiting[0]
		best.waiting = best.waiting[1:]
		s.queued--
		best.running++
		t.busy = len(best.waiting) > 0 || best.running > 1
		s.turn++
		best.lastTurn = s.turn
		s.running++
		t.granted = true
		close(t.ready)
	}
}

// drain refuses what waits (errDraining) and new requests, and returns a
// channel closed once the requests at work are released.
func (s *fairScheduler) drain() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.draining = true
	for _, c := range s.clients {
		for _, t := range c.waiting {
			t.err = errDraining
			s.queued--
			close(t.ready)
		}
		c.waiting = nil
		s.forgetLocked(c)
	}
	ch := make(chan struct{})
	if s.running == 0 {
		close(ch)
	} else {
		s.idle = append(s.idle, ch)
	}
	return ch
}

type schedStats struct{ Running, Queued, Clients int }

func (s *fairScheduler) stats() schedStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return schedStats{s.running, s.queued, len(s.clients)}
}
