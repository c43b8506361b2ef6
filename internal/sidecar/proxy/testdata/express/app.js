// An Express 5 application with default router settings (case-insensitive, not strict about a
// trailing slash), the routes of the proxy's route matrix test. Every route names itself in an
// X-Route header and counts what it served (GET /__served). It prints "listening <port>" once
// it listens on 127.0.0.1 (port from PORT, 0 for any).
const express = require('express');

const app = express();
const served = {};
const route = (name) => (req, res) => {
  served[name] = (served[name] || 0) + 1;
  res.set('X-Route', name).send('served ' + name + '\n');
};
app.get('/__served', (req, res) => res.json(served));
app.all('/login', route('login'));
app.use('/api/v1/orders', route('orders'));
app.get('/search', route('search'));
app.post('/admin', route('admin'));
app.all('/report', route('report'));

const server = app.listen(Number(process.env.PORT || 0), '127.0.0.1', () => {
  console.log('listening ' + server.address().port);
});
