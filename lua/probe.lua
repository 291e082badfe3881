-- The circuit breaker's probe: one small write, refused exactly when the
-- decisions' writes would be (a full memory under noeviction, a read-only
-- replica, a refused password), where PING would still pass.
-- KEYS[1]: <prefix>:probe (expires by itself).
redis.call('HSET', KEYS[1], 'probe', 1)
redis.call('PEXPIRE', KEYS[1], 10000)
return 1
