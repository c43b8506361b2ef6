-- Shares, closing (see shares_open.lua, whose names this uses): writes add more units for the
-- replica (negative: gives them back) with what the opening restored, and starts the hold where
-- it restored.
--
-- The hold: a replica that restored its share found this Redis short of what was granted here,
-- so others' shares are likely missing too, and a grant before they re-assert theirs would
-- admit them again. Grants in the state wait until the hold (ms on Redis's clock), written into
-- s as start:hold: the other replicas hear of the loss within a heartbeat and re-assert; the
-- hold outlasts that. It carries over into the next window (its units were counted in p).
--
-- The hash lives until the end of the next window; a new window drops the fields of replicas
-- that wrote none in the last two once there are more than 35, so a hot key outliving its
-- replicas does not keep every id it ever saw.
if restored > 0 and hold_ms > 0 then
  hold = now + hold_ms
end
if add ~= 0 or restored ~= 0 then
  local sv = start
  if hold > now then
    sv = string.format('%d:%d', start, hold)
  end
  if kind == 1 then
    if restored > 0 and hold_ms > 0 then
      redis.call('HSET', key, 's', sv)
    end
    if id == '' then
      redis.call('HINCRBY', key, 'c', add)
    elseif dprev > 0 then
      -- One write for the count and the share (the field names this window from now on, so
      -- that p is restored once).
      redis.call('HSET', key, 'c', cur + add, 'p', prev, id, (mine + add) * TAGS + q)
    else
      redis.call('HSET', key, 'c', cur + add, id, (mine + add) * TAGS + q)
    end
  else
    if kind == 3 and had then
      redis.call('DEL', key) -- every field in it is from windows that ended
    end
    if id ~= '' then
      redis.call('HSET', key, 's', sv, 'c', dcur + add, 'p', prev, id, (mine + add) * TAGS + q)
    else
      redis.call('HSET', key, 's', sv, 'c', add, 'p', prev)
    end
    redis.call('PEXPIRE', key, 2 * window - (now - start))
    -- At most 128 fields are scanned (a listpack's worth): the state is the tenant's own key,
    -- and one stuffed by hand with millions must not stall Redis for every other tenant at its
    -- roll.
    local fields = 0
    if kind == 2 then
      fields = redis.call('HLEN', key)
    end
    if fields > 35 and fields <= 128 then
      local keep = {s = true, c = true, p = true}
      local all = redis.call('HGETALL', key)
      for i = 1, #all, 2 do
        local v = tonumber(all[i + 1])
        if not keep[all[i]] and (not v or (v % TAGS ~= q and v % TAGS ~= (q - 1) % TAGS)) then
          redis.call('HDEL', key, all[i])
        end
      end
    end
  end
end
