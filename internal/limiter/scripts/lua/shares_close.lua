-- Shares, closing (see shares_open.lua, whose names this uses): writes add more units for the
-- replica (negative: gives them back) with what the opening restored, and what changed of the
-- hold, which rides on s.
--
-- The hash lives until the end of the next window; a new window drops the fields of replicas
-- that wrote none in the last two once there are more than 35, so a hot key outliving its
-- replicas does not keep every id it ever saw.
if add ~= 0 or restored ~= 0 or hold_changed or carry ~= 0 then
  local sv = start
  if hold > now then
    sv = string.format('%d:%d:%d:%d:%d', start, hold, since, marks, peers)
  end
  if kind == 1 then
    if hold_changed then
      redis.call('HSET', key, 's', sv)
    end
    if add == 0 and restored == 0 then
      -- Only the hold changed.
    elseif id == '' then
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
      -- Every field in it is from windows that ended. UNLINK, not DEL: the state is the
      -- tenant's own key, and DEL of one stuffed with 2,000,000 fields frees them on Redis's one
      -- thread (0.8 s for every tenant); UNLINK frees a large value in the background, so this
      -- costs O(1) whatever the key holds (and DEL is not granted to the tenant at all).
      redis.call('UNLINK', key)
    end
    if id ~= '' then
      redis.call('HSET', key, 's', sv, 'c', dcur + add + carry, 'p', prev, id, (mine + add) * TAGS + q)
    else
      redis.call('HSET', key, 's', sv, 'c', add + carry, 'p', prev)
    end
    redis.call('PEXPIRE', key, 2 * window - (now - start))
    -- At most 128 fields are scanned (a listpack's worth): the state is the tenant's own key,
    -- and one stuffed by hand with millions must not stall Redis for every other tenant at its
    -- roll. Marks of a hold in force stay.
    local fields = 0
    if kind == 2 then
      fields = redis.call('HLEN', key)
    end
    if fields > 35 and fields <= 128 then
      local keep = {s = true, c = true, p = true}
      local all = redis.call('HGETALL', key)
      for i = 1, #all, 2 do
        local v = tonumber(all[i + 1])
        if not keep[all[i]] and string.sub(all[i], 1, 1) ~= '@' and (not v or (v % TAGS ~= q and v % TAGS ~= (q - 1) % TAGS)) then
          redis.call('HDEL', key, all[i])
        end
      end
    end
  end
  if hold > now then
    if marked then
      redis.call('HSET', key, '@' .. id, since)
    end
  elseif hold_changed then
    -- The hold ended early: its marks go (a listpack's worth at most is scanned, as above;
    -- beyond it they go with the hash).
    if redis.call('HLEN', key) <= 128 then
      local all = redis.call('HGETALL', key)
      for i = 1, #all, 2 do
        if string.sub(all[i], 1, 1) == '@' then
          redis.call('HDEL', key, all[i])
        end
      end
    end
  end
end
