import VigilKit
