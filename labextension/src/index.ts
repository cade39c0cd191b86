// The JAX Cluster panel: this user's clusters on this machine and their processes, live, in
// JupyterLab's left sidebar. Rows come from the server extension (jaxcluster/panel/server.py),
// which reads each cluster's health feed; this file only draws them and sends actions.

import {
  ILabShell,
  JupyterFrontEnd,
  JupyterFrontEndPlugin
} from '@jupyterlab/application';
import { URLExt } from '@jupyterlab/coreutils';
import { INotebookTracker } from '@jupyterlab/notebook';
import { ServerConnection } from '@jupyterlab/services';
import { LabIcon } from '@jupyterlab/ui-components';
import { Widget } from '@lumino/widgets';

import '../style/index.css';

const POLL_MS = 1000; // the issue asks for an update a second at least while a cell runs

interface IRow {
  process: number;
  host: string;
  state: string;
  doing: string;
  memory: string;
  device_memory: string;
  last_line: string;
  stack: string;
}

interface ICluster {
  key: string;
  kind: 'live' | 'kept';
  // a cluster a kernel runs
  notebook?: string | null;
  kernel?: string | null;
  pid?: number;
  kept?: string | null;
  error?: string;
  // a kept cluster no kernel shows
  name?: string;
  holder?: string | null;
  idle_since?: number | null;
  devices?: number;
  memory?: string;
  processes: IRow[] | number;
}

interface IListing {
  now: number;
  clusters: ICluster[];
}

const iconSvg =
  '<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 24 24">' +
  '<g class="jp-icon3" fill="#616161">' +
  '<rect x="3" y="3" width="8" height="8" rx="1"/>' +
  '<rect x="13" y="3" width="8" height="8" rx="1"/>' +
  '<rect x="3" y="13" width="8" height="8" rx="1"/>' +
  '<rect x="13" y="13" width="8" height="8" rx="1"/></g></svg>';

const clusterIcon = new LabIcon({ name: 'jaxcluster:panel', svgstr: iconSvg });

function element(
  tag: string,
  className: string,
  text = '',
  attributes: Record<string, string> = {}
): HTMLElement {
  const node = document.createElement(tag);
  if (className) {
    node.className = className;
  }
  node.textContent = text;
  for (const [name, value] of Object.entries(attributes)) {
    node.setAttribute(name, value);
  }
  return node;
}

function button(
  label: string,
  title: string,
  data: Record<string, string>
): HTMLElement {
  const attributes: Record<string, string> = { title, type: 'button' };
  for (const [name, value] of Object.entries(data)) {
    attributes[`data-${name}`] = value;
  }
  return element('button', 'jc-Button', label, attributes);
}

function duration(seconds: number): string {
  const s = Math.max(0, Math.round(seconds));
  if (s < 60) {
    return `${s} s`;
  }
  if (s < 3600) {
    return `${Math.floor(s / 60)} min ${s % 60} s`;
  }
  return `${Math.floor(s / 3600)} h ${Math.floor((s % 3600) / 60)} min`;
}

// "4 processes: 1 running, 3 waiting", the states in the order a reader looks for them
function summary(rows: IRow[]): string {
  const order = ['dead', 'asking', 'debugging', 'running', 'waiting', 'idle'];
  const counts = new Map<string, number>();
  for (const row of rows) {
    counts.set(row.state, (counts.get(row.state) ?? 0) + 1);
  }
  const parts = order
    .filter(state => counts.has(state))
    .map(state => `${counts.get(state)} ${state}`);
  const noun = rows.length === 1 ? 'process' : 'processes';
  return `${rows.length} ${noun}: ${parts.join(', ')}`;
}

class ClusterPanel extends Widget {
  private readonly tracker: INotebookTracker;
  private readonly settings = ServerConnection.makeSettings();
  private readonly stacks = new Set<string>(); // "key/process" whose stack is shown
  private readonly body: HTMLElement;
  private readonly status: HTMLElement;
  private timer: number | null = null;
  private last: IListing | null = null;

  constructor(tracker: INotebookTracker) {
    super();
    this.tracker = tracker;
    this.id = 'jaxcluster-panel';
    this.addClass('jc-Panel');
    this.title.icon = clusterIcon;
    this.title.caption = 'JAX Cluster';
    this.node.appendChild(element('h2', 'jc-Panel-title', 'JAX Cluster'));
    this.status = element('div', 'jc-Panel-status', '', { role: 'status' });
    this.body = element('div', 'jc-Panel-body');
    this.node.append(this.status, this.body);
    this.node.addEventListener('click', event => void this.clicked(event));
  }

  protected onAfterShow(): void {
    void this.poll();
  }

  protected onBeforeHide(): void {
    if (this.timer !== null) {
      window.clearTimeout(this.timer);
      this.timer = null;
    }
  }

  private async request(path: string, init: RequestInit = {}): Promise<any> {
    const url = URLExt.join(this.settings.baseUrl, 'jaxcluster', path);
    const response = await ServerConnection.makeRequest(url, init, this.settings);
    if (!response.ok) {
      throw new Error(`${response.status} ${response.statusText}`);
    }
    return response.json();
  }

  private async poll(): Promise<void> {
    if (this.timer !== null) {
      window.clearTimeout(this.timer);
      this.timer = null;
    }
    try {
      this.last = (await this.request('clusters')) as IListing;
      this.draw(this.last);
    } catch (error) {
      this.say(`The JAX Cluster server extension does not answer (${error}).`);
    }
    if (this.isVisible) {
      this.timer = window.setTimeout(() => void this.poll(), POLL_MS);
    }
  }

  private say(text: string): void {
    this.status.textContent = text;
  }

  private draw(listing: IListing): void {
    this.body.replaceChildren();
    if (listing.clusters.length === 0) {
      this.body.appendChild(
        element(
          'p',
          'jc-Panel-empty',
          'No cluster runs. Start one in a notebook: %jax_cluster start --nodes 4'
        )
      );
    }
    for (const cluster of listing.clusters) {
      this.body.appendChild(
        cluster.kind === 'kept'
          ? this.keptCard(cluster, listing.now)
          : this.liveCard(cluster)
      );
    }
  }

  private liveCard(cluster: ICluster): HTMLElement {
    const card = element('section', 'jc-Cluster', '', {
      'data-cluster': cluster.key
    });
    const header = element('header', 'jc-Cluster-header');
    const where = cluster.notebook ?? `kernel pid ${cluster.pid}`;
    header.appendChild(element('span', 'jc-Cluster-name', where, { title: where }));
    if (cluster.kept) {
      header.appendChild(element('span', 'jc-Cluster-tag', `kept: ${cluster.kept}`));
    }
    const actions = element('div', 'jc-Cluster-actions');
    const key = cluster.key;
    actions.append(
      button('Interrupt all', 'Interrupt every process', {
        action: 'interrupt',
        key
      }),
      button('Restart', 'Restart the cluster (its kernel runs it)', {
        action: 'restart',
        key
      }),
      button('Stop', 'Stop the cluster', { action: 'stop', key })
    );
    card.append(header, actions);
    if (cluster.error) {
      card.appendChild(element('p', 'jc-Cluster-error', cluster.error));
    }
    const rows = Array.isArray(cluster.processes) ? cluster.processes : [];
    card.appendChild(element('p', 'jc-Cluster-facts', summary(rows)));
    const list = element('div', 'jc-Processes', '', { role: 'list' });
    for (const row of rows) {
      list.appendChild(this.processRow(key, row));
    }
    card.appendChild(list);
    return card;
  }

  // one process: what it does on the first line; its memory, where it runs, its devices'
  // memory and its last line of output below; its stack under it when asked for
  private processRow(key: string, row: IRow): HTMLElement {
    const process = String(row.process);
    const item = element('div', `jc-Process jc-mod-${row.state}`, '', {
      'data-process': process,
      role: 'listitem'
    });
    const device =
      row.device_memory === '\u2014' ? '' : ` \u00b7 device ${row.device_memory}`;
    const rest = ` \u00b7 ${row.host}${device}${row.last_line ? ' \u00b7 ' + row.last_line : ''}`;
    const detail = element('span', 'jc-Process-detail', '', {
      title: `${row.memory}${rest}`
    });
    detail.append(
      element('span', 'jc-Process-memory', row.memory, {
        title: 'resident memory on its host'
      }),
      rest
    );
    const actions = element('span', 'jc-Process-actions');
    actions.append(
      button('\u25a0', `Interrupt process ${row.process}`, {
        action: 'interrupt',
        key,
        process
      }),
      button('\u2261', `Show the Python stack of process ${row.process}`, {
        action: 'stack',
        key,
        process
      })
    );
    item.append(
      element('span', 'jc-Process-index', process, {
        title: `JAX process ${process}`
      }),
      element('span', 'jc-Process-state', row.doing),
      actions,
      detail
    );
    if (this.stacks.has(`${key}/${process}`)) {
      item.appendChild(
        element(
          'pre',
          'jc-Process-stack',
          row.stack ||
            (row.state === 'idle'
              ? 'idle: no cell runs on it'
              : 'not looked at yet: shown within a second or two')
        )
      );
    }
    return item;
  }

  private keptCard(cluster: ICluster, now: number): HTMLElement {
    const card = element('section', 'jc-Cluster jc-mod-kept', '', {
      'data-cluster': cluster.key
    });
    const header = element('header', 'jc-Cluster-header');
    header.append(
      element('span', 'jc-Cluster-name', `kept: ${cluster.name}`),
      element(
        'span',
        'jc-Cluster-idle',
        cluster.holder
          ? `attached to ${cluster.holder}`
          : cluster.idle_since
            ? `idle for ${duration(now - cluster.idle_since)}`
            : 'idle'
      )
    );
    const facts = `${cluster.processes} processes, ${cluster.devices} devices, ${cluster.memory}`;
    const key = cluster.key;
    const actions = element('div', 'jc-Cluster-actions');
    actions.append(
      button('Attach', 'Attach the current notebook\u2019s kernel to it', {
        action: 'attach',
        key,
        name: cluster.name ?? ''
      }),
      button('Stop', 'Stop the kept cluster', { action: 'stop', key })
    );
    card.append(header, element('p', 'jc-Cluster-facts', facts), actions);
    return card;
  }

  private async clicked(event: Event): Promise<void> {
    const target = (event.target as HTMLElement).closest('button');
    if (!target || !this.node.contains(target)) {
      return;
    }
    const { action, key, process, name } = target.dataset;
    if (!action || !key) {
      return;
    }
    if (action === 'stack') {
      const shown = `${key}/${process}`;
      if (!this.stacks.delete(shown)) {
        this.stacks.add(shown);
      }
      if (this.last) {
        this.draw(this.last);
      }
      return;
    }
    if (action === 'attach') {
      await this.attach(name ?? '');
      return;
    }
    this.say(`${action}…`);
    try {
      const body = JSON.stringify(
        process === undefined ? {} : { process: Number(process) }
      );
      const answer = await this.request(
        `clusters/${encodeURIComponent(key)}/${action}`,
        { method: 'POST', body }
      );
      this.say(answer.said);
    } catch (error) {
      this.say(`${action} failed: ${error}`);
    }
    void this.poll();
  }

  private async attach(name: string): Promise<void> {
    const kernel =
      this.tracker.currentWidget?.sessionContext.session?.kernel ?? null;
    if (!kernel) {
      this.say('Open a notebook first: its kernel attaches to the cluster.');
      return;
    }
    this.say(`attaching ${name}…`);
    const future = kernel.requestExecute({
      code: `%load_ext jaxcluster\n%jax_cluster attach ${name}`,
      silent: true,
      store_history: false
    });
    const reply = await future.done;
    const content = reply.content;
    this.say(
      content.status === 'ok'
        ? `${name} is attached to this notebook`
        : `attach failed: ${'evalue' in content ? content.evalue : content.status}`
    );
    void this.poll();
  }
}

const plugin: JupyterFrontEndPlugin<void> = {
  id: 'jaxcluster:panel',
  description: 'This user\u2019s JAX clusters and their processes, live.',
  autoStart: true,
  requires: [ILabShell, INotebookTracker],
  activate: (
    app: JupyterFrontEnd,
    shell: ILabShell,
    tracker: INotebookTracker
  ) => {
    shell.add(new ClusterPanel(tracker), 'left', { rank: 900 });
  }
};

export default plugin;
