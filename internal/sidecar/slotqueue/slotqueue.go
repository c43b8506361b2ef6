// Package slotqueue keeps the requests that wait for a slot of an in-flight rule's full key in
// one sidecar: first come first served per key, bounded per key and in total.
//
// Only the oldest waiter of a key (its head) asks Redis for a slot. It asks when a slot of its
// key is given back in this sidecar (Released wakes it at once) and otherwise every Poll, since
// a slot given back by another replica is not heard of here: a key costs one Redis call per
// Poll per sidecar while it has waiters, whatever their number. Across replicas the heads take
// turns in the key's line in Redis (see limiter.Waiter): a head's tries keep its place there,
// so it must try at least every Poll. A waiter leaves when it got its slot, when its context
// ends (its client went away, or its timeout passed) or when its try says it is decided; the
// next in line becomes the head and asks at once.
//
// Bounds: a key has at most the size its rule says of waiters, the sidecar at most Max in all,
// each face at most its Share (a waiter holds one of its face's connections), and each draws
// WaiterBytes from the sidecar's memory budget (Memory) while it waits. A request that finds
// no room is refused at once (ErrFull, ErrNoMemory). The faces share one queue per key: their
// waiters of a key are served in the order they came, whichever face they came through.
package slotqueue

import (
	"container/list"
	"context"
	"errors"
	"sync"
	"time"

	"github.com/redline-dev/redline/internal/sidecar/membudget"
)

// DefaultPoll is how often the head of a key asks Redis again when no slot of its key was given
// back in this sidecar.
const DefaultPoll = 250 * time.Millisecond

// DefaultMax is the most waiters of all keys a Queue keeps when Max is 0.
const DefaultMax = 4096

// WaiterBytes is what one waiter draws from the memory budget: its entry here, and a share of
// the goroutine and request it keeps waiting.
const WaiterBytes = 4096

// ErrFull is Wait's error when the key's queue, or the sidecar's, has no room.
var ErrFull = errors.New("the queue of requests waiting for a slot is full")

// ErrNoMemory is Wait's error when the memory budget has no room for one more waiter.
var ErrNoMemory = errors.New("no memory left in the sidecar's budget for one more waiting request")

// Queue is the waiters of every key of a sidecar. The zero value is ready to use.
type Queue struct {
	// Max bounds the waiters of all keys (0: DefaultMax).
	Max int
	// Memory is the budget each waiter draws WaiterBytes from (nil: none).
	Memory *membudget.Budget
	// Poll is how often a head asks again unwoken (0: DefaultPoll).
	Poll time.Duration

	mu    sync.Mutex
	keys  map[string]*list.List // of *waiter, oldest first
	total int
}

// Share bounds the waiters that came through one face, within every key: each holds one of
// the face's connections while it waits, so a face lets at most half of them wait, and the
// other half stays for the other keys' requests. A Share belongs to one Queue.
type Share struct {
	// Max is the most waiters of the face (0: no bound but the Queue's).
	Max int
	n   int // guarded by the Queue's mu
}

type waiter struct {
	wake chan struct{} // cap 1: a wake while the head is busy is kept for its next turn
}

// Wait takes a slot of key with try, in turn. When nobody waits for key, try(false) runs at once;
// when it does not decide (done false), or others wait already, the request joins the key's
// queue, of at most size, and waits its turn: the head runs try(true) when a slot of key is
// Released here, and every Poll. Wait returns nil once a try decided, ctx's error when ctx ended first, and
// ErrFull or ErrNoMemory when there was no room to wait (sh, if set, is the share of the face
// the request came through). queued, if set, hears +1 when the request joins the queue and -1
// when it leaves.
func (q *Queue) Wait(ctx context.Context, key string, size int, sh *Share, try func(head bool) (done bool), queued func(delta int)) error {
	q.mu.Lock()
	empty := q.keys[key] == nil
	q.mu.Unlock()
	if empty && try(false) {
		return nil
	}
	w, el, err := q.join(key, size, sh)
	if err != nil {
		return err
	}
	if queued != nil {
		queued(1)
		defer queued(-1)
	}
	defer q.leave(key, el, sh)
	poll := q.PollEvery()
	// Only the head polls: a waiter behind it lets its first timer lapse and waits for the
	// wake that makes it the head, so the waiters of a key cost one timer, not one each.
	t := time.NewTimer(poll)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-w.wake:
		case <-t.C:
		}
		if q.head(key, el) {
			if try(true) {
				return nil
			}
			t.Reset(poll)
		}
	}
}

// PollEvery is how often a head asks again unwoken: Poll, or DefaultPoll.
func (q *Queue) PollEvery() time.Duration {
	if q.Poll <= 0 {
		return DefaultPoll
	}
	return q.Poll
}

// join adds a waiter at the back of key's queue, or says why there is no room.
func (q *Queue) join(key string, size int, sh *Share) (*waiter, *list.Element, error) {
	limit := q.Max
	if limit <= 0 {
		limit = DefaultMax
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	l := q.keys[key]
	if l != nil && l.Len() >= size || q.total >= limit || sh != nil && sh.Max > 0 && sh.n >= sh.Max {
		return nil, nil, ErrFull
	}
	if !q.Memory.Draw(WaiterBytes, nil) {
		return nil, nil, ErrNoMemory
	}
	if q.keys == nil {
		q.keys = map[string]*list.List{}
	}
	if l == nil {
		l = list.New()
		q.keys[key] = l
	}
	w := &waiter{wake: make(chan struct{}, 1)}
	el := l.PushBack(w)
	q.total++
	if sh != nil {
		sh.n++
	}
	// A slot given back between the caller's try and its joining wakes nobody: the next Poll
	// finds it, rather than every first waiter asking Redis twice.
	return w, el, nil
}

// leave takes el out of key's queue; the next in line, now the head, asks at once.
func (q *Queue) leave(key string, el *list.Element, sh *Share) {
	q.mu.Lock()
	defer q.mu.Unlock()
	l := q.keys[key]
	wasHead := l.Front() == el
	l.Remove(el)
	q.total--
	if sh != nil {
		sh.n--
	}
	q.Memory.Return(WaiterBytes)
	if l.Len() == 0 {
		delete(q.keys, key)
		return
	}
	if wasHead {
		l.Front().Value.(*waiter).signal()
	}
}

// head says whether el is the oldest waiter of key.
func (q *Queue) head(key string, el *list.Element) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.keys[key].Front() == el
}

// Released wakes the head of key's queue, if any: a slot of key was given back in this sidecar.
func (q *Queue) Released(key string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if l := q.keys[key]; l != nil {
		l.Front().Value.(*waiter).signal()
	}
}

// Len is how many requests wait now, of all keys.
func (q *Queue) Len() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.total
}

func (w *waiter) signal() {
	select {
	case w.wake <- struct{}{}:
	default:
	}
}
