-- Shares: what each replica was granted in a window, kept beside the window's count, so that
-- counts a Redis lost (a failover to a replica that lagged, a restart without persistence) are
-- restored by the replicas that were granted them, exactly, and never counted twice.
--
-- The window state (see fixed_window.lua) holds, beside s, c and p, one field per replica that
-- was granted units in it, named by the replica's id: its share of one window, as
-- share * TAGS + (window index mod TAGS). A replica writes only its own field. Each call says
-- what the replica knows it was granted in the current window and the one before (ARGV), and
-- this prologue raises the state to it first: c by what this Redis lacks of the replica's share
-- of the current window, p by what it lacks of the previous one. The share becomes
-- max(field, known), so a repeat, or a replica whose knowledge is older than the field, adds
-- nothing.
--
-- Why p needs only the field, not a second one: replication is in order, so a Redis that holds
-- a write of window k by a replica also holds everything of window k-1 (the roll to window k
-- came after it). p is incomplete only where the replica's field still names window k-1 or an
-- older one: then the field says what of its k-1 share reached this Redis. Once the replica
-- writes in window k here, its field names k and p is its concern no longer.
local TAGS = 4096

-- read_state returns the window state of key for the window starting at start, with what the
-- replica id knows of its shares (m1 units in the window starting at ms, m2 in the one before)
-- restored: kind (1 the state is this window's, 2 the previous window's, 3 none or older), cur,
-- prev, had (a state of an older window is there), mine (the replica's share of this window),
-- dcur and dprev (what was restored to each window), current (the replica's field names this
-- window) and hold (until when, ms on Redis's clock, grants in the state wait: see hold_state).
local function read_state(key, window, start, id, ms, m1, m2)
  local h
  if id ~= '' then
    h = redis.call('HMGET', key, 's', 'c', 'p', id, 'h')
  else
    h = redis.call('HMGET', key, 's', 'c', 'p')
  end
  local kind, cur, prev = 3, 0, 0
  local s = tonumber(h[1])
  if s == start then
    kind, cur, prev = 1, tonumber(h[2]) or 0, tonumber(h[3]) or 0
  elseif s == start - window then
    kind, prev = 2, tonumber(h[2]) or 0
  end
  if id == '' then
    return kind, cur, prev, s ~= nil, 0, 0, 0, false, 0
  end
  local hold = 0
  if kind ~= 3 then
    hold = tonumber(h[5]) or 0
  end
  local q = (start / window) % TAGS
  local held_cur, held_prev, current = 0, 0, false
  local f = tonumber(h[4])
  if f then
    local fq = f % TAGS
    if fq == q then
      -- A field naming this window in a state of another is a tag TAGS windows old.
      if kind == 1 then
        held_cur, current = (f - fq) / TAGS, true
      end
    elseif kind ~= 3 and fq == (q - 1) % TAGS then
      held_prev = (f - fq) / TAGS
    end
  end
  local known_cur, known_prev = 0, 0
  if ms == start then
    known_cur, known_prev = m1, m2
  elseif ms == start - window then
    known_prev = m1
  end
  local dcur, dprev = math.max(known_cur - held_cur, 0), 0
  if not current then
    dprev = math.max(known_prev - held_prev, 0)
  end
  return kind, cur + dcur, prev + dprev, s ~= nil, held_cur + dcur, dcur, dprev, current, hold
end

-- hold_state makes grants in the state wait until upto (ms on Redis's clock): a replica that
-- restored its share found this Redis short of what was granted here, so others' shares are
-- likely missing too, and a grant before they re-assert theirs would admit them again. The
-- other replicas hear of the loss within a heartbeat and re-assert; the hold outlasts that.
local function hold_state(key, upto)
  redis.call('HSET', key, 'h', upto)
end

-- write_state counts add more units (negative: gives them back) for the replica in the state
-- read_state returned, with what it restored. The hash lives until the end of the next window;
-- a new window drops the fields of replicas that wrote none in the last two once there are
-- more than 32, so a hot key outliving its replicas does not keep every id it ever saw.
local function write_state(key, window, start, elapsed, id, add, kind, cur, prev, had, mine, dcur, dprev, current)
  local q = (start / window) % TAGS
  if kind == 1 then
    if id == '' then
      if add ~= 0 then
        redis.call('HINCRBY', key, 'c', add)
      end
      return
    end
    -- One write for the count and the share (the field names this window from now on, so
    -- that p is restored once).
    if dprev > 0 then
      redis.call('HSET', key, 'c', cur + add, 'p', prev, id, (mine + add) * TAGS + q)
    elseif dcur + add ~= 0 or not current then
      redis.call('HSET', key, 'c', cur + add, id, (mine + add) * TAGS + q)
    end
    return
  end
  if kind == 3 and had then
    redis.call('DEL', key) -- every field in it is from windows that ended
  end
  if id ~= '' then
    redis.call('HSET', key, 's', start, 'c', dcur + add, 'p', prev, id, (mine + add) * TAGS + q)
  else
    redis.call('HSET', key, 's', start, 'c', dcur + add, 'p', prev)
  end
  redis.call('PEXPIRE', key, 2 * window - elapsed)
  -- At most 128 fields are scanned (a listpack's worth): the state is the tenant's own key, and
  -- one stuffed by hand with millions must not stall Redis for every other tenant at its roll.
  local fields = 0
  if kind == 2 then
    fields = redis.call('HLEN', key)
  end
  if fields > 35 and fields <= 128 then
    local keep = {s = true, c = true, p = true, h = true}
    local all = redis.call('HGETALL', key)
    for i = 1, #all, 2 do
      local v = tonumber(all[i + 1])
      if not keep[all[i]] and v and v % TAGS ~= q and v % TAGS ~= (q - 1) % TAGS then
        redis.call('HDEL', key, all[i])
      end
    end
  end
end

-- open_state is read_state for a decision script: the replica's id and shares are ARGV[6] to
-- ARGV[9]. held says that grants wait (a hold in force, or one this call starts by restoring:
-- ARGV[10] ms); a call of cost 0 only restores and never waits.
local function open_state(key, window, start, now, cost)
  local kind, cur, prev, had, mine, dcur, dprev, current, hold =
    read_state(key, window, start, ARGV[6] or '', tonumber(ARGV[7]) or 0, tonumber(ARGV[8]) or 0, tonumber(ARGV[9]) or 0)
  local hold_ms = tonumber(ARGV[10]) or 0
  if dcur + dprev > 0 and hold_ms > 0 then
    hold = now + hold_ms
  end
  return kind, cur, prev, had, mine, dcur, dprev, current, cost > 0 and hold > now
end

-- close_state writes what a decision script granted with what open_state restored, and starts
-- the hold where it restored.
local function close_state(key, window, start, elapsed, now, grant, kind, cur, prev, had, mine, dcur, dprev, current)
  if grant == 0 and dcur + dprev == 0 then
    return
  end
  write_state(key, window, start, elapsed, ARGV[6] or '', grant, kind, cur, prev, had, mine, dcur, dprev, current)
  local hold_ms = tonumber(ARGV[10]) or 0
  if dcur + dprev > 0 and hold_ms > 0 then
    hold_state(key, now + hold_ms)
  end
end
