package topkeys

import (
	"cmp"
	"slices"
	"strings"
	"sync"
)

// UsageKeys is the most keys a Usage keeps: the heaviest users of a long window's quota this
// sidecar saw. A key it does not keep takes the place of the lightest when it has used more.
const UsageKeys = 16

// Usage keeps, for one rule with a long window (a calendar period, or a rolling window over a
// day), the keys that used the most of the current period's quota, as Redis answered this
// sidecar's decisions of them: each key's latest count. A period is named by its start and
// end (ms): a count of a later period starts the keys again, one of an earlier period (which
// started and ended before) is ignored, and one of a period that started no earlier but ends
// sooner (a reload made a month's rule a day's) starts the keys again too. A rolling window has
// no period (0, 0): its counts are replaced, and a key not decided for a window goes (Take's
// since). Memory is fixed (UsageKeys entries); it is safe for concurrent use.
type Usage struct {
	mu         sync.Mutex
	start, end int64
	keys       []usageEntry
}

type usageEntry struct {
	Entry
	seen int64 // ms of the latest count
}

// Use records that key has used used units of the period from start to end (ms; 0 and 0 for a
// rolling window), as counted at now (ms).
func (u *Usage) Use(key, label string, used uint64, start, end, now int64) {
	u.mu.Lock()
	defer u.mu.Unlock()
	switch {
	case end == 0 && u.end != 0:
		u.start, u.end, u.keys = 0, 0, u.keys[:0] // the rule rolls now (a reload changed its window)
	case end < u.end && start < u.start:
		return // a decision of a period that ended
	case end != u.end:
		u.start, u.end, u.keys = start, end, u.keys[:0] // a later period, or a reload's shorter one
	}
	for i := range u.keys {
		e := &u.keys[i]
		if e.Key != key {
			continue
		}
		if end == 0 || used > e.Count {
			e.Count = used // a calendar count only grows in its period; replicas' answers race
		}
		e.seen = now
		return
	}
	at := len(u.keys)
	if at == UsageKeys {
		at = 0
		for i := range u.keys {
			if u.keys[i].Count < u.keys[at].Count {
				at = i
			}
		}
		if used <= u.keys[at].Count {
			return // lighter than every key kept: nothing copied
		}
	} else {
		u.keys = append(u.keys, usageEntry{})
	}
	key, label = own(key, label)
	u.keys[at] = usageEntry{Entry: Entry{Key: key, Label: label, Count: used}, seen: now}
}

// Take returns the period's end and its k heaviest users, the most first (ties by Key), of
// the keys counted at or after since (ms): a rolling window's older counts no longer say what
// the key used, and are dropped. A period that ended by now (ms) is dropped whole.
func (u *Usage) Take(k int, since, now int64) (end int64, top []Entry) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.end != 0 && u.end <= now {
		u.keys = u.keys[:0]
	}
	u.keys = slices.DeleteFunc(u.keys, func(e usageEntry) bool { return e.seen < since })
	for _, e := range u.keys {
		top = append(top, e.Entry)
	}
	slices.SortFunc(top, func(a, b Entry) int {
		if c := cmp.Compare(b.Count, a.Count); c != 0 {
			return c
		}
		return strings.Compare(a.Key, b.Key)
	})
	if len(top) > k {
		top = top[:k]
	}
	return u.end, top
}

// Most is the most a key used of the period in force at now (ms), of the keys counted at or
// after since (ms): 0 when the period ended or no key was counted.
func (u *Usage) Most(since, now int64) uint64 {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.end != 0 && u.end <= now {
		return 0
	}
	var most uint64
	for _, e := range u.keys {
		if e.seen >= since {
			most = max(most, e.Count)
		}
	}
	return most
}
